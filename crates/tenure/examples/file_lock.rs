//! Leader election among the processes of one host, on the file lock: the README's first example.
//! Run it in two terminals (`cargo run -p tenure --example file_lock`): the first leads for five
//! seconds and hands over on exit; the second, waiting, leads at once.

use std::time::Duration;

use tenure::{locks::file::FileLock, Elector, Timing};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Per user: $XDG_RUNTIME_DIR/tenure/my-service.json. For one election across users, open the
    // same path in all of them, e.g. FileLock::open("/var/lib/my-service/leader.json").
    let lock = FileLock::open(FileLock::default_path("my-service")?)?;
    let elector = Elector::builder(format!("replica-{}", std::process::id()), lock) // unique identity
        .timing(Timing::default()) // client-go's: 15 s lease, 10 s renew deadline, 2 s retry
        .spawn()?;
    let mut leadership = elector.subscribe(); // tokio watch: leader, term, own role
    tokio::spawn(async move {
        while leadership.changed().await.is_ok() {
            println!("{:?}", *leadership.borrow());
        }
    });
    let tenure = elector.acquired().await?; // waits until this process leads
    for step in 0..5 {
        let term = tenure.check()?; // no I/O: fails once the self-fencing deadline has passed
        println!("step {step} as leader, fencing token {term}"); // pass `term` to what you write
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    drop(tenure); // a graceful release waits for every guard
    elector.shutdown().await?; // releases the lock: the next process leads at once
    Ok(())
}
