//! Checkpoints in etcd, written only while the writer's tenure holds (feature `etcd`).
//!
//! The end-to-end fencing example: every save is a fenced transaction of the election
//! ([`EtcdElection::fenced_txn`]: etcd applies it only while the election key of the term exists)
//! whose own compare is "the checkpoint is still the one I read"; a deposed leader (paused past its
//! lease, its key expired) is refused however late its write arrives, because a key that is created
//! again gets a new create revision. Nothing but the server's own transaction decides.

use async_trait::async_trait;
use tenure::Term;
use tenure_etcd::proto::etcdserverpb::{compare, request_op, Compare, PutRequest, RequestOp, TxnRequest};
use tenure_etcd::{EtcdElection, EtcdError, FencedTxnError};

use super::{
    check_not_superseded, decode, encode, kept_changing, Checkpoint, CheckpointError, CheckpointStore, StoredCheckpoint,
};

/// How often a save retries when the checkpoint changed between its read and its transaction
/// (only this leader can write, so only its own concurrent saves can cause that).
const SAVE_ATTEMPTS: usize = 3;

/// Checkpoints of one controller under one etcd key, fenced by the election of `election`.
///
/// ```no_run
/// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
/// use tenure_etcd::EtcdElection;
/// use tenure_ha::checkpoint::etcd::EtcdCheckpointStore;
/// let election = EtcdElection::connect(&["127.0.0.1:2379".into()], "ip-allocator").await?;
/// let store = EtcdCheckpointStore::new(election, "ip-allocator/checkpoint", "ip-allocator");
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct EtcdCheckpointStore {
    election: EtcdElection,
    key: String,
    controller: String,
}

impl EtcdCheckpointStore {
    /// The checkpoint of `controller` at `key` (outside the election's prefix), guarded by the
    /// election `election` connects to.
    pub fn new(election: EtcdElection, key: impl Into<String>, controller: impl Into<String>) -> EtcdCheckpointStore {
        EtcdCheckpointStore { election, key: key.into(), controller: controller.into() }
    }

    fn error(&self, error: EtcdError) -> CheckpointError {
        CheckpointError::Store { store: self.describe(), reason: error.to_string() }
    }
}

#[async_trait]
impl CheckpointStore for EtcdCheckpointStore {
    async fn load(&self) -> Result<Option<StoredCheckpoint>, CheckpointError> {
        let found = self.election.get(&self.key).await.map_err(|e| self.error(e))?;
        Ok(found.and_then(|kv| decode(&kv.value, &self.controller, &self.key)))
    }

    async fn save(&self, term: Term, checkpoint: &Checkpoint) -> Result<(), CheckpointError> {
        let superseded = CheckpointError::Superseded { ours: term, newer: None };
        let document = encode(term, checkpoint);
        for _ in 0..SAVE_ATTEMPTS {
            let stored = self.election.get(&self.key).await.map_err(|e| self.error(e))?;
            check_not_superseded(stored.as_ref().map(|kv| kv.value.as_slice()), term)?;
            let unchanged = match &stored {
                Some(kv) => revision_is(&self.key, compare::CompareTarget::Mod, kv.mod_revision),
                None => revision_is(&self.key, compare::CompareTarget::Create, 0),
            };
            let put = PutRequest { key: self.key.as_bytes().to_vec(), value: document.clone(), ..Default::default() };
            let put = RequestOp { request: Some(request_op::Request::RequestPut(put)) };
            let request = TxnRequest { compare: vec![unchanged], success: vec![put], failure: Vec::new() };
            match self.election.fenced_txn(term, request).await {
                Ok(answer) if answer.succeeded => return Ok(()),
                Ok(_) => {} // the checkpoint changed since it was read: read again
                Err(FencedTxnError::Deposed { .. } | FencedTxnError::BadTerm { .. }) => return Err(superseded),
                Err(FencedTxnError::Etcd(error)) => return Err(self.error(error)),
            }
        }
        Err(kept_changing(self.describe()))
    }

    fn controller(&self) -> &str {
        &self.controller
    }

    fn describe(&self) -> String {
        format!("etcd key {}", self.key)
    }
}

/// `<target>_revision(key) == revision` (0 for a create revision: the key does not exist).
fn revision_is(key: &str, target: compare::CompareTarget, revision: i64) -> Compare {
    let target_union = match target {
        compare::CompareTarget::Mod => compare::TargetUnion::ModRevision(revision),
        _ => compare::TargetUnion::CreateRevision(revision),
    };
    let (result, target) = (compare::CompareResult::Equal as i32, target as i32);
    Compare { result, target, key: key.as_bytes().to_vec(), range_end: Vec::new(), target_union: Some(target_union) }
}
