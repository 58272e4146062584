//! Who a candidate is to ZooKeeper, and who may touch the nodes it creates: digest
//! authentication (`addauth digest user:password`) and the ACLs that follow from it.
//!
//! Why a module of its own: the same rule must hold for every session a candidate opens (after
//! an expiry too) and for every node it creates, and the check that turns a wrong password into a
//! clear error at start needs the same idea of "our identity".
//!
//! The ACL rule, with credentials: the election node and the candidates' nodes grant everything
//! to the creating user (ZooKeeper's `auth` scheme) and only READ to anyone else. Candidates of one
//! election must therefore share one ZooKeeper user; anybody may still see who leads (`tenure
//! status`, a Curator observer), but no other user can join the election, change a node, or
//! delete one (ZooKeeper checks DELETE on the parent, the election node). Without credentials
//! nodes stay open to anyone, as before.

use std::fmt;

use base64::Engine as _;
use sha1::{Digest as _, Sha1};
use zookeeper_client as zk;

use crate::ZkError;

/// How candidates authenticate to ZooKeeper; [`ZkOptions::default`] is an unauthenticated
/// session whose nodes anyone may change.
///
/// Why one value: [`crate::ZkElection::connect_with`] takes it once, and every session of every
/// candidate of that election is opened with it.
#[derive(Clone, Default)]
pub struct ZkOptions {
    digest: Option<(String, String)>,
    /// Boxed: the options are large, and an election value is passed around.
    #[cfg(feature = "tls")]
    tls: Option<std::sync::Arc<zk::TlsOptions>>,
    /// The PEM the TLS options were made of, to explain a failed handshake.
    #[cfg(feature = "tls")]
    tls_pem: Option<(String, Option<(String, String)>)>,
}

impl ZkOptions {
    /// Options without authentication.
    pub fn new() -> Self {
        Self::default()
    }

    /// Authenticates every session with ZooKeeper's digest scheme as `user` with `password`, and
    /// protects the nodes created as described in the module documentation.
    #[must_use]
    pub fn with_digest(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.digest = Some((user.into(), password.into()));
        self
    }

    /// Talks TLS to every server (ZooKeeper's `secureClientPort`), trusting the CA certificates in
    /// `ca_pem` and, if given, presenting the client certificate and key `identity` (PEM), for
    /// servers with `ssl.clientAuth=need`. Only with the crate feature `tls`.
    #[cfg(feature = "tls")]
    pub fn with_tls(mut self, ca_pem: &str, identity: Option<(&str, &str)>) -> Result<Self, ZkError> {
        let tls_error = |e: zk::Error| ZkError::Tls(e.to_string());
        let mut tls = zk::TlsOptions::new().with_pem_ca(ca_pem).map_err(tls_error)?;
        if let Some((cert, key)) = identity {
            tls = tls.with_pem_identity(cert, key).map_err(tls_error)?;
        }
        self.tls = Some(std::sync::Arc::new(tls));
        self.tls_pem = Some((ca_pem.to_owned(), identity.map(|(c, k)| (c.to_owned(), k.to_owned()))));
        Ok(self)
    }

    /// Why a TLS handshake with the first of `servers` fails, if it does: zookeeper-client retries
    /// failed handshakes until the session timeout and then reports only a timeout.
    #[cfg(feature = "tls")]
    pub(crate) async fn explain_tls_failure(&self, servers: &str) -> Option<String> {
        let (ca_pem, identity) = self.tls_pem.clone()?;
        let server = servers.split(',').next()?.trim_start_matches("tcp+tls://").to_owned();
        let probe = move || crate::tls_probe::handshake(&server, &ca_pem, identity.as_ref());
        tokio::task::spawn_blocking(probe).await.ok()?.err()
    }

    /// Whether sessions use TLS.
    pub fn uses_tls(&self) -> bool {
        #[cfg(feature = "tls")]
        return self.tls.is_some();
        #[cfg(not(feature = "tls"))]
        false
    }

    /// The connection string for the client: with TLS every server is marked `tcp+tls://`.
    pub(crate) fn connect_string(&self, servers: &str) -> String {
        if !self.uses_tls() {
            return servers.to_owned();
        }
        servers
            .split(',')
            .map(|server| if server.contains("://") { server.to_owned() } else { format!("tcp+tls://{server}") })
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The digest user, if any (for messages).
    pub fn user(&self) -> Option<&str> {
        self.digest.as_ref().map(|(user, _)| user.as_str())
    }

    /// A connector for a new session with `session_timeout`, carrying the credentials.
    pub(crate) fn connector(&self, session_timeout: std::time::Duration) -> zk::Connector {
        let connector = zk::Client::connector().with_session_timeout(session_timeout);
        #[cfg(feature = "tls")]
        let connector = match &self.tls {
            Some(tls) => {
                // zookeeper-client builds its rustls configuration with the process's default
                // provider; with its TLS two providers are compiled in (ring, aws-lc-rs), so one
                // must be chosen. Ring, as tonic and kube use. Already installed: nothing to do.
                let _ = rustls::crypto::ring::default_provider().install_default();
                connector.with_tls(tls.as_ref().clone())
            }
            None => connector,
        };
        match &self.digest {
            Some((user, password)) => connector.with_auth("digest", format!("{user}:{password}").as_bytes()),
            None => connector,
        }
    }

    /// The ACL of the nodes a candidate creates (the election path and its own node).
    pub(crate) fn acls(&self) -> zk::Acls<'static> {
        match self.digest {
            Some(_) => zk::Acls::new(CREATOR_ALL_ANYONE_READ),
            None => zk::Acls::anyone_all(),
        }
    }

    /// Fails with [`ZkError::NotAuthorized`] when the election path exists and its ACL lets
    /// nothing this session may be create a node in it: the usual sign of a wrong password (a
    /// digest "succeeds" with any password and only names another identity) or of another user.
    pub(crate) async fn check_may_campaign(&self, client: &zk::Client, path: &str) -> Result<(), ZkError> {
        let Some((user, password)) = &self.digest else { return Ok(()) };
        let acl = match client.get_acl(path).await {
            Ok((acl, _)) => acl,
            Err(zk::Error::NoNode) => return Ok(()),
            Err(error) => return Err(ZkError::Request(error)),
        };
        let ours = digest_id(user, password);
        let may_create = acl.iter().any(|entry| {
            entry.permission().has(zk::Permission::CREATE)
                && match entry.scheme() {
                    "world" => entry.id() == "anyone",
                    "digest" => entry.id() == ours,
                    // ip, x509, sasl: identities this check cannot judge; let the server decide.
                    _ => true,
                }
        });
        if may_create {
            return Ok(());
        }
        let granted = acl
            .iter()
            .filter(|entry| entry.permission().has(zk::Permission::CREATE))
            .map(|entry| format!("{}:{}", entry.scheme(), entry.id().split(':').next().unwrap_or_default()))
            .collect::<Vec<_>>();
        Err(ZkError::NotAuthorized { path: path.to_owned(), user: user.clone(), granted })
    }
}

impl fmt::Debug for ZkOptions {
    /// Never shows the password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkOptions").field("digest_user", &self.user()).field("tls", &self.uses_tls()).finish()
    }
}

/// All permissions for the authenticated creator, READ for anyone.
const CREATOR_ALL_ANYONE_READ: &[zk::Acl] =
    &[zk::Acl::new_const(zk::Permission::ALL, "auth", ""), zk::Acl::new_const(zk::Permission::READ, "world", "anyone")];

/// The identity ZooKeeper derives from digest credentials: `user:base64(sha1(user:password))`
/// (its `DigestAuthenticationProvider`), as it appears in ACLs.
pub(crate) fn digest_id(user: &str, password: &str) -> String {
    let hash = Sha1::digest(format!("{user}:{password}").as_bytes());
    format!("{user}:{}", base64::engine::general_purpose::STANDARD.encode(hash))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_identity_is_zookeepers() {
        // As printed by ZooKeeper 3.8's
        // `org.apache.zookeeper.server.auth.DigestAuthenticationProvider super:superpw`.
        assert_eq!(digest_id("super", "superpw"), "super:g9oN2HttPfn8MMWJZ2r45Np/LIA=");
    }

    #[test]
    fn password_never_shows_in_debug() {
        let shown = format!("{:?}", ZkOptions::new().with_digest("alice", "s3cret"));
        assert!(shown.contains("alice") && !shown.contains("s3cret"), "{shown}");
    }
}
