//! A kube-rs controller's leader election on a Lease, with the `kube::Client` it already has.
//! Run it against a cluster, or against `tenure apiserver` with its KUBECONFIG:
//! `POD_NAME=a cargo run -p tenure-kube --example kube_client`.

use tenure::Elector;
use tenure_kube::{KubeLock, KubeLockRef, LockKind};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let client = kube::Client::try_default().await?; // the controller's own client
    let identity = std::env::var("POD_NAME")?; // unique per replica (downward API: metadata.name)
    let lease = KubeLockRef { namespace: "default".into(), kind: LockKind::Leases, name: "my-controller".into() };
    let lock = KubeLock::new(client, &lease, &identity);
    let elector = Elector::builder(identity, lock.clone()).spawn()?; // client-go's timing
    let events = lock.record_events(&elector); // "<pod> became leader" Events on the Lease
    let tenure = elector.acquired().await?;
    // Run the controller until leadership ends or the process is asked to stop; check
    // tenure.check()? (its term is the fencing token) before each write it makes.
    tokio::select! {
        () = tenure.ended() => eprintln!("lost leadership of term {}", tenure.term()),
        _ = tokio::signal::ctrl_c() => {}
    }
    drop(tenure);
    elector.shutdown().await?; // releases the Lease: another replica leads at once
    events.finish().await;
    Ok(())
}
