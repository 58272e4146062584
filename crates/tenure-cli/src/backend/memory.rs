//! `memory:`: a lock inside this process only. Useful to try `elect` or `run` without any file,
//! and in tests; candidates in other processes never see it.

use std::fmt;
use std::sync::Arc;

use tenure::locks::memory::MemoryStore;
use tenure::{redact_credentials, RecordLock};
use tenure_kube::ClusterOptions;

use super::{Backend, Fut, LockUrl, LockUrlError, RecordStore};
use crate::lock_scope::LockScope;

/// The lock in this process's memory.
#[derive(Debug)]
pub struct MemoryBackend;

/// Parses `memory:`, with nothing after the colon.
pub(super) fn parse(text: &str, rest: &str) -> Result<LockUrl, LockUrlError> {
    match rest {
        "" => Ok(Arc::new(MemoryBackend)),
        _ => Err(LockUrlError::BadMemoryUrl(redact_credentials(text).into_owned())),
    }
}

impl fmt::Display for MemoryBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("memory:")
    }
}

impl RecordStore for MemoryBackend {
    fn open<'a>(&'a self, client: &'a str, _: &'a ClusterOptions) -> Fut<'a, Arc<dyn RecordLock>> {
        Box::pin(async move { Ok(Arc::new(MemoryStore::new().client(client)) as Arc<dyn RecordLock>) })
    }
}

impl Backend for MemoryBackend {
    fn record_store(&self) -> Option<&dyn RecordStore> {
        Some(self)
    }

    fn scope(&self, _defaulted: bool, _uid: u32) -> Option<LockScope> {
        let explanation = "the lock is in this process's memory: no other process takes part in the election";
        Some(LockScope { lock_file: None, scope: "this process", explanation: explanation.to_owned() })
    }
}
