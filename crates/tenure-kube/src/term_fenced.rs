//! Term-fenced compare-and-swap for any Kubernetes object: the object carries the term of its last
//! fenced writer, and a write under a lower term is refused.
//!
//! Why: the write gate ([`crate::WriteGate`]) keeps a process that does not lead from sending
//! writes (W1), and cancels those in flight when its tenure ends; it cannot recall a write that
//! already reached the wire before a pause. The API server has no transaction over two objects
//! (the Lease and the one written), so it cannot refuse a write because the Lease moved, as etcd
//! and ZooKeeper do. What it has is a compare-and-swap on one object's `resourceVersion`; this
//! module puts the writer's term in the same object, in the annotation [`TERM_ANNOTATION`], and
//! [`update`] only writes over a term that is not higher than its own, in one compare-and-swap.
//!
//! **What it guarantees**, among the writers that use it: once a write under term `t` has
//! landed on an object, no
//! write under a term below `t` lands on that object, however late it arrives; the object's
//! term never goes down. A deposed leader's write is refused as soon as the next leader has
//! written the same object; it is **not** refused on an object the next leader has not written
//! yet (nothing on the server knows of the new term there). So: fence the objects both leaders
//! write (the ones whose content must not go back), and keep the write gate for the rest.
//! Writers that do not use it are not held back (an admission policy that rejects a lower term
//! for every writer is not shipped: it could not be checked here, without a real API server).
//!
//! Terms are those of one election: the term of a [`tenure::Tenure`] ([`tenure::Term`]), which
//! grows with every new tenure on the lock (S2).

use kube::api::{Api, PostParams};
use kube::Resource;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tenure::Term;

/// The annotation that carries the term of an object's last fenced writer (decimal).
pub const TERM_ANNOTATION: &str = "tenure.dev/term";

/// How many times [`update`] reads and tries again when the object changed between its read and
/// its write (a concurrent writer under the same or a lower term).
const ATTEMPTS: usize = 5;

/// Why a term-fenced update did not happen. Nothing was written in any case.
#[derive(Debug, thiserror::Error)]
pub enum TermFenceError {
    /// The object shows a higher term: a later tenure has written it. The writer is deposed: it
    /// must not retry under this term.
    #[error("deposed: {object} was written under term {shows}, above this writer's term {ours}")]
    Deposed {
        /// The object, `namespace/name`.
        object: String,
        /// The term of the update.
        ours: Term,
        /// The term the object shows.
        shows: Term,
    },
    /// The object's term annotation is not a number: nothing can be compared, so nothing is
    /// written (a foreign writer, a typo; fix or remove the annotation).
    #[error("{object}: annotation {TERM_ANNOTATION} is {value:?}, not a term")]
    Malformed {
        /// The object, `namespace/name`.
        object: String,
        /// The annotation's value.
        value: String,
    },
    /// The object kept changing between read and write ([`ATTEMPTS`] conflicts in a row).
    #[error("{object} kept changing under the update ({ATTEMPTS} conflicts in a row)")]
    KeptChanging {
        /// The object, `namespace/name`.
        object: String,
    },
    /// The API server failed or refused (not found, forbidden, unreachable).
    #[error(transparent)]
    Api(#[from] kube::Error),
}

/// The term an object shows: `None` without the annotation (no fenced writer yet).
pub fn term_of<K: Resource>(object: &K) -> Result<Option<Term>, String> {
    match object.meta().annotations.as_ref().and_then(|a| a.get(TERM_ANNOTATION)) {
        None => Ok(None),
        Some(value) => value.trim().parse::<u64>().map(|term| Some(Term(term))).map_err(|_| value.clone()),
    }
}

/// Reads the object `name`, applies `change` to it, and writes it back with the annotation
/// [`TERM_ANNOTATION`] set to `term`, by compare-and-swap on the `resourceVersion` read, only if
/// the object shows no term above `term` ([`TermFenceError::Deposed`] otherwise). On a conflict
/// (the object changed meanwhile) it reads again and re-applies `change`, a few times. Returns
/// the object as written.
pub async fn update<K>(api: &Api<K>, name: &str, term: Term, mut change: impl FnMut(&mut K)) -> Result<K, TermFenceError>
where
    K: Resource + Clone + DeserializeOwned + Serialize + std::fmt::Debug,
{
    let mut object_name = String::new();
    for _ in 0..ATTEMPTS {
        let mut object = api.get(name).await?;
        object_name = format!("{}/{name}", object.meta().namespace.as_deref().unwrap_or(""));
        match term_of(&object) {
            Ok(Some(shows)) if shows > term => return Err(TermFenceError::Deposed { object: object_name, ours: term, shows }),
            Ok(_) => {}
            Err(value) => return Err(TermFenceError::Malformed { object: object_name, value }),
        }
        change(&mut object);
        object.meta_mut().annotations.get_or_insert_with(Default::default).insert(TERM_ANNOTATION.to_owned(), term.0.to_string());
        match api.replace(name, &PostParams::default(), &object).await {
            Ok(written) => return Ok(written),
            Err(kube::Error::Api(status)) if status.code == 409 => continue,
            Err(error) => return Err(error.into()),
        }
    }
    Err(TermFenceError::KeptChanging { object: object_name })
}
