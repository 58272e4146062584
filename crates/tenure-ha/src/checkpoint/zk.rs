//! Checkpoints in a ZooKeeper node next to the election, written only while the writer's tenure
//! holds (feature `zk`).
//!
//! Every save is one fenced multi-operation of the election ([`ZkElection::fenced_multi`]: "the
//! election node of my term still exists") with "set the checkpoint node's data if its version is
//! still the one I read" (or "create it", when there was none). The
//! server applies both or neither, so a deposed leader (its session expired while it was paused,
//! its node deleted) is refused however late its write arrives, even before the next leader has
//! written anything; and the term stored in the document keeps C1 on top: a save is refused when
//! the node holds a newer term. The ZooKeeper counterpart of the etcd store's guarded transaction.

use async_trait::async_trait;
use tenure::Term;
use tenure_zk::zk;
use tenure_zk::{session_ended, FencedMultiError, ZkElection, ZkError};

use super::{
    check_not_superseded, decode, encode, kept_changing, Checkpoint, CheckpointError, CheckpointStore, StoredCheckpoint,
};

/// How often a save retries when the checkpoint node changed between its read and its write
/// (only this leader can write, so only its own concurrent saves can cause that).
const SAVE_ATTEMPTS: usize = 3;

/// Checkpoints of one controller in one ZooKeeper node, fenced by the election `election`.
///
/// ```no_run
/// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use tenure_ha::checkpoint::zk::ZkCheckpointStore;
/// use tenure_zk::ZkElection;
/// let election = ZkElection::connect("127.0.0.1:2181", "/tenure/ip-allocator", Duration::from_secs(6)).await?;
/// let store = ZkCheckpointStore::next_to(election, "ip-allocator"); // node /tenure/ip-allocator-checkpoint
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct ZkCheckpointStore {
    election: ZkElection,
    path: String,
    controller: String,
}

impl ZkCheckpointStore {
    /// The checkpoint of `controller` in the node at `path` (an absolute path outside the
    /// election's, whose parent exists), guarded by the election `election` connects to.
    pub fn new(election: ZkElection, path: impl Into<String>, controller: impl Into<String>) -> ZkCheckpointStore {
        ZkCheckpointStore { election, path: path.into(), controller: controller.into() }
    }

    /// The checkpoint of `controller` in the node next to the election: `<election path>-checkpoint`
    /// (a sibling, so that the election's children stay latch nodes only, as Curator expects).
    pub fn next_to(election: ZkElection, controller: impl Into<String>) -> ZkCheckpointStore {
        let path = format!("{}-checkpoint", election.path());
        ZkCheckpointStore::new(election, path, controller)
    }

    /// The node the checkpoint is kept in.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// A store error, after replacing the election's session if the error says it ended (so
    /// that the next save, one period later, goes through a live one).
    async fn error(&self, error: ZkError) -> CheckpointError {
        if session_ended(&error) {
            if let Err(reconnect) = self.election.reconnect().await {
                tracing::warn!(store = %self.describe(), error = %reconnect, "cannot open a new ZooKeeper session");
            }
        }
        CheckpointError::Store { store: self.describe(), reason: error.to_string() }
    }

    /// The stored document and its version; `None` when the node does not exist.
    async fn read(&self) -> Result<Option<(Vec<u8>, i32)>, CheckpointError> {
        let client = self.election.client();
        match client.get_data(&self.path).await {
            Ok((data, stat)) => Ok(Some((data, stat.version))),
            Err(zk::Error::NoNode) => Ok(None),
            Err(error) => Err(self.error(ZkError::Request(error)).await),
        }
    }
}

#[async_trait]
impl CheckpointStore for ZkCheckpointStore {
    async fn load(&self) -> Result<Option<StoredCheckpoint>, CheckpointError> {
        Ok(self.read().await?.and_then(|(data, _)| decode(&data, &self.controller, &self.path)))
    }

    async fn save(&self, term: Term, checkpoint: &Checkpoint) -> Result<(), CheckpointError> {
        let superseded = CheckpointError::Superseded { ours: term, newer: None };
        let document = encode(term, checkpoint);
        for _ in 0..SAVE_ATTEMPTS {
            let stored = self.read().await?;
            check_not_superseded(stored.as_ref().map(|(data, _)| data.as_slice()), term)?;
            let create = zk::CreateMode::Persistent.with_acls(self.election.acls());
            let write = |multi: &mut zk::MultiWriter<'_>| match &stored {
                Some((_, version)) => multi.add_set_data(&self.path, &document, Some(*version)),
                None => multi.add_create(&self.path, &document, &create),
            };
            match self.election.fenced_multi(term, write).await {
                Ok(_) => return Ok(()),
                // The checkpoint node changed since it was read: read again.
                Err(FencedMultiError::Operation {
                    source: zk::Error::BadVersion | zk::Error::NodeExists | zk::Error::NoNode, ..
                }) => {}
                Err(FencedMultiError::Deposed { .. } | FencedMultiError::BadTerm { .. }) => return Err(superseded),
                // Only an invalid path fails here: a configuration error, not a transient one.
                Err(FencedMultiError::Invalid(error) | FencedMultiError::Operation { source: error, .. }) => {
                    return Err(CheckpointError::Store { store: self.describe(), reason: error.to_string() })
                }
                Err(FencedMultiError::Zk(error)) => return Err(self.error(error).await),
            }
        }
        Err(kept_changing(self.describe()))
    }

    fn controller(&self) -> &str {
        &self.controller
    }

    fn describe(&self) -> String {
        format!("ZooKeeper node {}", self.path)
    }
}
