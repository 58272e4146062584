//! Leader election on ZooKeeper, shared with Curator `LeaderLatch`es on the same path. Start a
//! ZooKeeper server on port 2181, then `cargo run -p tenure-zk --example zk_election`.

use std::time::Duration;

use tenure_zk::ZkElection;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The session timeout plays the lease; the server may cap it (2 to 20 ticks by default).
    let election = ZkElection::connect("127.0.0.1:2181", "/tenure/my-service", Duration::from_secs(10)).await?;
    let elector = election.campaign(format!("replica-{}", std::process::id()))?;
    let tenure = elector.acquired().await?;
    println!("leading with term {} (the leader node's creation zxid)", tenure.term());
    // ... leader work, with tenure.check()? before each side effect ...
    drop(tenure);
    elector.shutdown().await?; // deletes the node: the next candidate leads at once
    Ok(())
}
