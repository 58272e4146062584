//! `tenure write`: a write that the lock itself refuses once the writer's tenure is over.
//!
//! Why: a command run by `tenure run` (or a script beside `tenure elect`) checks that it leads,
//! then writes; a pause between the two (SIGSTOP, a frozen VM, a slow disk) can let the write land
//! after the next leader began. `tenure write --term "$TENURE_TERM" FILE < content` makes the
//! write through the lock: on a file lock it replaces FILE only while the lock still shows the
//! tenure of that term, in the lock's own compare-and-swap
//! ([`tenure::locks::file::FileLock::write_fenced`]); on etcd it puts the key FILE in a
//! transaction guarded by the election key of the term, on ZooKeeper it sets (or creates) the node
//! FILE in a multi-operation that checks the node of the term: the store decides, in the same
//! operation as the write. A subcommand rather than an endpoint of
//! `tenure elect --http`: the writer is the command, which holds the term (`tenure run` passes it
//! as `TENURE_TERM`), and a script needs no HTTP client for it.

use std::io::Read;
use std::path::PathBuf;

use clap::Args;
use tenure::Term;

use crate::options::ElectionOptions;
use crate::{error::CliError, exit, output};

/// The most a fenced write takes from standard input.
const MAX_CONTENT_BYTES: u64 = 64 * 1024 * 1024;

/// Arguments of `tenure write`.
#[derive(Debug, Args)]
#[command(
    about = "Replace a file (etcd: a key, ZooKeeper: a node) with standard input, only while the tenure of --term still holds the lock",
    long_about = "Replace FILE with standard input, only while the lock still shows the tenure of \
        --term: the lock itself refuses the write of a deposed leader, even one paused between its \
        last check and this write. On a file lock FILE must be on the lock's file system (it is \
        replaced by a rename: readers see the old or the new content); on etcd FILE is a key, \
        written in a transaction guarded by the election key of --term; on ZooKeeper it is an \
        absolute node path, set (or created) in a multi-operation that checks the node of \
        --term.\n\n\
        Exit status: 0 written; 3 deposed (another tenure holds the lock, or it was released: \
        nothing was written, do not retry under this term); 1 any other failure (nothing was \
        written); 2 usage.\n\n\
        File, etcd and ZooKeeper locks; a Kubernetes object is fenced by the library's \
        term-fenced update (tenure_kube::term_fenced).",
    after_help = "Example, in a command run by tenure run:\n  \
        generate-config | tenure write --election nightly-backup --term \"$TENURE_TERM\" /var/lib/backup/state.json"
)]
pub struct WriteArgs {
    #[command(flatten)]
    election: ElectionOptions,

    /// The term of the tenure the write is made under (`tenure run` passes it as TENURE_TERM).
    #[arg(long, value_name = "TERM", env = "TENURE_TERM")]
    term: u64,

    /// The file to replace (etcd: the key; ZooKeeper: the node's absolute path).
    #[arg(value_name = "FILE")]
    target: PathBuf,
}

/// Runs `tenure write`; returns the exit status.
pub async fn write(args: WriteArgs) -> Result<u8, CliError> {
    let url = args.election.lock_url()?;
    let mut content = Vec::new();
    std::io::stdin()
        .take(MAX_CONTENT_BYTES + 1)
        .read_to_end(&mut content)
        .map_err(CliError::io("read standard input"))?;
    if content.len() as u64 > MAX_CONTENT_BYTES {
        return Err(CliError::Ended("standard input is larger than 64 MiB: nothing was written"));
    }
    match url.write_fenced(Term(args.term), &args.target, content).await {
        Ok(()) => Ok(exit::SUCCESS),
        Err(CliError::Deposed(why)) => {
            output::error_line(&format!("tenure: {why}: nothing was written"));
            Ok(exit::DEPOSED)
        }
        Err(error) => Err(error),
    }
}
