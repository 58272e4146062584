//! Writes fenced by ZooKeeper itself (invariant W2): a user's multi-operation that the server
//! applies only while the tenure it was made under is the current one.
//!
//! Why: the write gate and self-fencing stop a leader that knows it is deposed, not one paused
//! (GC, SIGSTOP, a frozen VM) between its last check and its write, nor a write sent through a
//! session that outlives the candidate's (a data session with a longer timeout, a client that
//! opens a new session after an expiry: KAFKA-6082). Here the server decides in the same
//! operation: the user's operations are preceded by `check_version(<election node of the
//! term>, -1)`, which fails with `NoNode` once that node is gone: its candidate's session ended
//! or it resigned, and node names carry a per-client guid, so a node once gone never returns.
//! A failure of that check is [`FencedMultiError::Deposed`]; a failure of one of the user's own
//! operations is [`FencedMultiError::Operation`], with the index among the user's operations.

use tenure::Term;

use crate::{zk, ZkError};

/// Why a fenced multi-operation ([`ZkElection::fenced_multi`](crate::ZkElection::fenced_multi))
/// did not run. Nothing of it was applied, whatever the variant (a multi-operation is atomic).
#[derive(Debug, thiserror::Error)]
pub enum FencedMultiError {
    /// The tenure of `term` is over: the election node whose creation zxid is `term` is gone
    /// (the server checked this in the multi-operation itself). The writer is deposed: it must
    /// not retry under this term.
    #[error("deposed: the tenure of term {term} in ZooKeeper election {path} is over (it shows {shows})")]
    Deposed {
        /// The election path.
        path: String,
        /// The term the write was made under.
        term: Term,
        /// Who leads now, read after the refusal.
        shows: String,
    },
    /// `term` cannot be the term of any tenure (0, or beyond ZooKeeper's zxids): a caller's
    /// bug, not a deposed leader.
    #[error("term {term} names no tenure of a ZooKeeper election: {reason}")]
    BadTerm {
        /// The term given.
        term: Term,
        /// Why no tenure has it.
        reason: &'static str,
    },
    /// One of the user's own operations failed (a version that moved on, a node that exists or
    /// is missing) while the tenure held: nothing was applied, and the user may re-read and
    /// retry. `index` counts the user's operations from 0.
    #[error("operation {index} of a fenced multi-operation failed: {source}")]
    Operation {
        /// The failed operation, among the user's.
        index: usize,
        /// The server's answer to it.
        source: zk::Error,
    },
    /// The user's operations could not be built (an invalid path).
    #[error("a fenced multi-operation could not be built: {0}")]
    Invalid(zk::Error),
    /// ZooKeeper could not be asked (no session, a timeout).
    #[error(transparent)]
    Zk(#[from] ZkError),
}

/// The creation zxid a term stands for, or why it cannot be one.
pub(crate) fn zxid_of(term: Term) -> Result<i64, FencedMultiError> {
    match i64::try_from(term.0) {
        Ok(0) => Err(FencedMultiError::BadTerm { term, reason: "terms are creation zxids, which start at 1" }),
        Ok(zxid) => Ok(zxid),
        Err(_) => Err(FencedMultiError::BadTerm { term, reason: "beyond the largest ZooKeeper zxid" }),
    }
}

/// What a failed commit means: `Ok(())` for "the election node is gone" (deposed), otherwise
/// the error to give the user, with the user's own operation index.
pub(crate) fn classify(error: zk::MultiWriteError) -> Result<(), FencedMultiError> {
    match error {
        zk::MultiWriteError::OperationFailed { index: 0, source: zk::Error::NoNode } => Ok(()),
        zk::MultiWriteError::OperationFailed { index: 0, source } => Err(ZkError::Request(source).into()),
        zk::MultiWriteError::OperationFailed { index, source } => {
            Err(FencedMultiError::Operation { index: index - 1, source })
        }
        zk::MultiWriteError::RequestFailed { source } => Err(ZkError::Request(source).into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn term_zero_and_terms_beyond_zxids_are_bad_terms() {
        assert!(matches!(zxid_of(Term(0)), Err(FencedMultiError::BadTerm { .. })));
        assert!(matches!(zxid_of(Term(u64::MAX)), Err(FencedMultiError::BadTerm { .. })));
        assert_eq!(zxid_of(Term(5)).unwrap(), 5);
    }

    #[test]
    fn a_missing_election_node_is_deposed_and_the_users_failures_keep_their_own_index() {
        let failed = |index, source| zk::MultiWriteError::OperationFailed { index, source };
        assert!(classify(failed(0, zk::Error::NoNode)).is_ok());
        assert!(matches!(
            classify(failed(2, zk::Error::BadVersion)),
            Err(FencedMultiError::Operation { index: 1, source: zk::Error::BadVersion })
        ));
        assert!(matches!(
            classify(zk::MultiWriteError::RequestFailed { source: zk::Error::SessionExpired }),
            Err(FencedMultiError::Zk(ZkError::Request(zk::Error::SessionExpired)))
        ));
    }
}
