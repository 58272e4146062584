//! Writes fenced by etcd itself (invariant W2): a user's transaction that etcd applies only while
//! the tenure it was made under is the current one.
//!
//! Why: the write gate and self-fencing stop a leader that knows it is deposed, not one paused
//! (GC, SIGSTOP, a frozen VM) between its last check and its write: that write reaches etcd after
//! the lease ran out and the next leader began. Here etcd decides, in the same operation as the
//! write. The user's transaction is nested in (or, with success operations alone, merged into)
//! an outer one whose one compare is [`leader_compare`](crate::leader_compare): the election key
//! of the term still exists with the create revision that is the term. That the key leads (no key
//! of the election is older) is checked once per tenure, when the key is looked up: keys are only
//! created at the current revision, so the oldest key stays the oldest until it is gone (a queued
//! follower's term is refused by that lookup). A key deleted (released, lease expired, `etcdctl
//! del`) and created again gets a new create revision, so a tenure, once over, never passes the
//! compare again.
//!
//! One round trip tells the three outcomes apart: the outer compare held and the user's compares
//! held (`succeeded`), the outer compare held but the user's did not (`succeeded == false`, the
//! user's failure operations ran), or the outer compare failed: then the outer failure branch
//! reads who leads now, and the caller gets [`FencedTxnError::Deposed`] naming them. Nothing of
//! the user's transaction runs when deposed, not even its failure operations.
//!
//! Interoperable with `etcdctl elect` candidates: the election key is the key of etcd's own
//! election protocol, so a tenure of an `etcdctl elect` leader fences writes the same way.

use tenure::Term;

use crate::client;
use crate::proto::etcdserverpb::{request_op, response_op, RequestOp, TxnRequest, TxnResponse};
use crate::{leader_compare, EtcdError};

/// Why a fenced transaction ([`EtcdElection::fenced_txn`](crate::EtcdElection::fenced_txn)) did
/// not run. Nothing of the user's transaction was applied, whatever the variant.
#[derive(Debug, thiserror::Error)]
pub enum FencedTxnError {
    /// The tenure of `term` is over: its election key is gone or was created again (etcd
    /// checked this in the transaction itself). The writer is deposed: it must not retry under
    /// this term.
    #[error("deposed: the tenure of term {term} in etcd election {election:?} is over (etcd shows {shows})")]
    Deposed {
        /// The election's name.
        election: String,
        /// The term the write was made under.
        term: Term,
        /// Who leads now, as etcd answered in the same transaction.
        shows: String,
    },
    /// `term` cannot be the term of any tenure (0, or beyond etcd's revisions): a caller's bug,
    /// not a deposed leader.
    #[error("term {term} names no tenure of an etcd election: {reason}")]
    BadTerm {
        /// The term given.
        term: Term,
        /// Why no tenure has it.
        reason: &'static str,
    },
    /// etcd could not be asked (unreachable, timed out, refused the request): whether the
    /// transaction ran is unknown only if the error is a timeout after sending it.
    #[error(transparent)]
    Etcd(#[from] EtcdError),
}

/// The create revision a term stands for, or why it cannot be one.
pub(crate) fn revision_of(term: Term) -> Result<i64, FencedTxnError> {
    match i64::try_from(term.0) {
        Ok(0) => Err(FencedTxnError::BadTerm { term, reason: "terms are create revisions, which start at 1" }),
        Ok(revision) => Ok(revision),
        Err(_) => Err(FencedTxnError::BadTerm { term, reason: "beyond the largest etcd revision" }),
    }
}

/// The outer transaction: `user` runs only while `key`, found to lead when the tenure's first
/// fenced write looked it up ([`EtcdElection::leader_key`](crate::EtcdElection::leader_key)),
/// still exists with the create revision `term`; otherwise the leader of `prefix` is read. A transaction with
/// compares or failure operations of its own is nested (second return value `true`); one with
/// success operations alone runs them directly in the outer success branch, which etcd applies a
/// little faster.
pub(crate) fn outer_txn(prefix: &str, key: &str, term: Term, user: TxnRequest) -> (TxnRequest, bool) {
    let nested = !user.compare.is_empty() || !user.failure.is_empty();
    let success =
        if nested { vec![RequestOp { request: Some(request_op::Request::RequestTxn(user)) }] } else { user.success };
    let who_leads = RequestOp { request: Some(request_op::Request::RequestRange(client::first_created(prefix))) };
    let compare = vec![leader_compare(key, term)];
    (TxnRequest { compare, success, failure: vec![who_leads] }, nested)
}

/// What the outer transaction's answer means for the user: the nested answer (with the outer
/// header, which carries the revision) or the outer one when nothing was `nested`, or who leads
/// instead (`None`: an answer without the nested one).
pub(crate) fn user_answer(outer: TxnResponse, nested: bool) -> Result<TxnResponse, Option<String>> {
    if outer.succeeded && !nested {
        return Ok(outer);
    }
    let header = outer.header;
    let mut responses = outer.responses.into_iter().filter_map(|r| r.response);
    if outer.succeeded {
        return match responses.next() {
            Some(response_op::Response::ResponseTxn(inner)) => Ok(TxnResponse { header, ..inner }),
            _ => Err(None),
        };
    }
    let shows = match responses.next() {
        Some(response_op::Response::ResponseRange(range)) => match range.kvs.first() {
            Some(kv) => format!(
                "{:?} leading at term {} with key {}",
                String::from_utf8_lossy(&kv.value),
                kv.create_revision,
                String::from_utf8_lossy(&kv.key)
            ),
            None => String::from("no leader"),
        },
        _ => String::from("an unreadable leader"),
    };
    Err(Some(shows))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::etcdserverpb::{RangeResponse, ResponseHeader, ResponseOp};
    use crate::proto::mvccpb::KeyValue;

    #[test]
    fn term_zero_and_terms_beyond_etcds_revisions_are_refused_as_bad_terms() {
        assert!(matches!(revision_of(Term(0)), Err(FencedTxnError::BadTerm { .. })));
        assert!(matches!(revision_of(Term(u64::MAX)), Err(FencedTxnError::BadTerm { .. })));
        assert_eq!(revision_of(Term(7)).unwrap(), 7);
    }

    #[test]
    fn the_users_transaction_is_nested_under_the_leader_compare() {
        let user =
            TxnRequest { compare: Vec::new(), success: vec![client::get_op("x")], failure: vec![client::get_op("y")] };
        let (outer, nested) = outer_txn("e/", "e/1a", Term(9), user.clone());
        assert!(nested);
        assert_eq!(outer.compare, vec![leader_compare("e/1a", Term(9))]);
        assert_eq!(outer.success, vec![RequestOp { request: Some(request_op::Request::RequestTxn(user)) }]);
        assert!(matches!(outer.failure[0].request, Some(request_op::Request::RequestRange(_))));
        // Success operations alone: not nested.
        let plain = TxnRequest { compare: Vec::new(), success: vec![client::get_op("x")], failure: Vec::new() };
        let (outer, nested) = outer_txn("e/", "e/1a", Term(9), plain.clone());
        assert!(!nested);
        assert_eq!(outer.success, plain.success);
    }

    #[test]
    fn a_failed_outer_compare_names_who_leads_and_a_malformed_answer_is_no_panic() {
        let leader =
            KeyValue { key: b"e/2b".to_vec(), value: b"b".to_vec(), create_revision: 12, ..Default::default() };
        let range = RangeResponse { kvs: vec![leader], ..Default::default() };
        let deposed = TxnResponse {
            succeeded: false,
            responses: vec![ResponseOp { response: Some(response_op::Response::ResponseRange(range)) }],
            ..Default::default()
        };
        assert_eq!(user_answer(deposed, true).unwrap_err().unwrap(), "\"b\" leading at term 12 with key e/2b");
        let nobody = TxnResponse { succeeded: false, ..Default::default() };
        assert_eq!(user_answer(nobody, false).unwrap_err().unwrap(), "an unreadable leader");
        let malformed = TxnResponse { succeeded: true, ..Default::default() };
        assert_eq!(user_answer(malformed, true).unwrap_err(), None);
        let header = ResponseHeader { revision: 40, ..Default::default() };
        let inner = TxnResponse { succeeded: false, ..Default::default() };
        let applied = TxnResponse {
            header: Some(header),
            succeeded: true,
            responses: vec![ResponseOp { response: Some(response_op::Response::ResponseTxn(inner)) }],
        };
        let answer = user_answer(applied, true).unwrap();
        assert!(!answer.succeeded, "the user's own compare failed");
        assert_eq!(answer.header, Some(header));
    }
}
