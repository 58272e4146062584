//! How a client proves who it is to a secured etcd cluster: TLS (a CA to check the servers, an
//! optional client certificate for `--client-cert-auth`) and etcd's own users (user name and
//! password exchanged for a token by the `Authenticate` call).
//!
//! Why a module of its own: the election code must not care whether the cluster is secured. The
//! connection asks this module for a token before each call and tells it when the server refused
//! one, and this module alone knows how to get a new one.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tonic::metadata::AsciiMetadataValue;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};
use tonic::Code;

use crate::proto::etcdserverpb::auth_client::AuthClient;
use crate::proto::etcdserverpb::AuthenticateRequest;
use crate::EtcdError;

/// Everything needed to reach a secured cluster; [`EtcdOptions::default`] is a plain-text
/// cluster without authentication (a test or a development cluster).
///
/// Why one value: the CLI and library users build it once from their configuration and pass it
/// to [`crate::EtcdElection::connect_with`]; new ways to authenticate add a method, not a
/// parameter.
#[derive(Clone, Default)]
pub struct EtcdOptions {
    pub(crate) tls: Option<EtcdTls>,
    pub(crate) credentials: Option<Credentials>,
}

impl EtcdOptions {
    /// Options for a plain-text cluster without authentication.
    pub fn new() -> Self {
        Self::default()
    }

    /// Talks TLS to every endpoint: `host:port` endpoints become `https://host:port`.
    #[must_use]
    pub fn with_tls(mut self, tls: EtcdTls) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Authenticates as the etcd user `user` (etcd's `auth enable`): the password is exchanged
    /// for a token, which is sent with every call and renewed when the server no longer accepts
    /// it (it expired, or the server restarted).
    #[must_use]
    pub fn with_user(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.credentials = Some(Credentials { user: user.into(), password: password.into() });
        self
    }

    /// The etcd user, if any (for messages).
    pub fn user(&self) -> Option<&str> {
        self.credentials.as_ref().map(|c| c.user.as_str())
    }

    /// Whether the endpoints are reached over TLS.
    pub fn uses_tls(&self) -> bool {
        self.tls.is_some()
    }
}

impl fmt::Debug for EtcdOptions {
    /// Never shows the password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdOptions")
            .field("tls", &self.tls)
            .field("user", &self.user())
            .field("password", &self.credentials.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

/// An etcd user name and password.
#[derive(Clone)]
pub(crate) struct Credentials {
    pub(crate) user: String,
    pub(crate) password: String,
}

/// TLS settings: the CA that signed the servers' certificates, and optionally this client's
/// certificate and key (needed when the servers run with `--client-cert-auth`).
///
/// Why PEM bytes and not paths: a library user may hold them in memory (a Kubernetes Secret);
/// the CLI reads the files and reports a missing one by its path.
#[derive(Clone)]
pub struct EtcdTls {
    ca_pem: Vec<u8>,
    identity: Option<(Vec<u8>, Vec<u8>)>,
    server_name: Option<String>,
}

impl fmt::Debug for EtcdTls {
    /// Never shows the private key.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdTls")
            .field("client_certificate", &self.identity.is_some())
            .field("server_name", &self.server_name)
            .finish()
    }
}

impl EtcdTls {
    /// Trusts the CA certificates in `ca_pem` (one or more PEM `CERTIFICATE` blocks) and no
    /// other: the system's roots are not used, as etcd clusters have their own CA.
    pub fn new(ca_pem: impl Into<Vec<u8>>) -> Result<Self, EtcdError> {
        let ca_pem = ca_pem.into();
        check_certificates(&ca_pem, "the CA bundle holds no PEM certificate", "the CA bundle is not valid PEM")?;
        Ok(EtcdTls { ca_pem, identity: None, server_name: None })
    }

    /// Presents the client certificate `cert_pem` (with its chain) and its private key `key_pem`
    /// (PKCS#8, PKCS#1 or SEC1 PEM) to the servers.
    pub fn with_client_identity(
        mut self,
        cert_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Result<Self, EtcdError> {
        let (cert_pem, key_pem) = (cert_pem.into(), key_pem.into());
        let (empty, invalid) =
            ("the client certificate file holds no PEM certificate", "the client certificate is not valid PEM");
        check_certificates(&cert_pem, empty, invalid)?;
        if let Err(e) = PrivateKeyDer::from_pem_slice(&key_pem) {
            return Err(EtcdError::Tls(format!("the client key holds no usable PEM private key: {e}")));
        }
        self.identity = Some((cert_pem, key_pem));
        Ok(self)
    }

    /// Checks the servers' certificates against `name` instead of the host of each endpoint
    /// (endpoints given as IP addresses whose certificates only name a DNS name).
    #[must_use]
    pub fn with_server_name(mut self, name: impl Into<String>) -> Self {
        self.server_name = Some(name.into());
        self
    }

    /// The tonic configuration.
    pub(crate) fn client_config(&self) -> ClientTlsConfig {
        // tonic builds its rustls configuration with the process's default crypto provider;
        // installing ring (which tonic and kube use) keeps that unambiguous when another crate
        // in the same binary enables a second provider. Already installed: nothing to do.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut config = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&self.ca_pem));
        if let Some((cert, key)) = &self.identity {
            config = config.identity(Identity::from_pem(cert, key));
        }
        if let Some(name) = &self.server_name {
            config = config.domain_name(name.clone());
        }
        config
    }
}

/// Checks that `pem` holds one or more certificates; else says `empty` or `invalid: <why>`.
fn check_certificates(pem: &[u8], empty: &str, invalid: &str) -> Result<(), EtcdError> {
    match CertificateDer::pem_slice_iter(pem).collect::<Result<Vec<_>, _>>() {
        Ok(certificates) if !certificates.is_empty() => Ok(()),
        Ok(_) => Err(EtcdError::Tls(empty.into())),
        Err(e) => Err(EtcdError::Tls(format!("{invalid}: {e}"))),
    }
}

/// A channel that carries the current auth token (if any) in each call's metadata.
pub(crate) type AuthedChannel = InterceptedService<Channel, TokenInterceptor>;

/// Adds the `token` metadata etcd expects from authenticated clients.
#[derive(Clone, Default)]
pub(crate) struct TokenInterceptor {
    token: Option<AsciiMetadataValue>,
}

impl tonic::service::Interceptor for TokenInterceptor {
    fn call(&mut self, mut request: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(token) = &self.token {
            request.metadata_mut().insert("token", token.clone());
        }
        Ok(request)
    }
}

/// The token of one user, fetched on first use and again after the server refused it.
pub(crate) struct Authenticator {
    credentials: Credentials,
    token: Mutex<Option<AsciiMetadataValue>>,
    /// Serialises authentications, so that a refused token costs one `Authenticate`, not one per
    /// concurrent call (each is a bcrypt check on the server).
    renewing: tokio::sync::Mutex<()>,
}

impl fmt::Debug for Authenticator {
    /// Shows the user, never the password or the token.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Authenticator").field("user", &self.credentials.user).finish_non_exhaustive()
    }
}

impl Authenticator {
    pub(crate) fn new(credentials: Credentials) -> Arc<Self> {
        Arc::new(Authenticator { credentials, token: Mutex::new(None), renewing: tokio::sync::Mutex::new(()) })
    }

    fn current(&self) -> Option<AsciiMetadataValue> {
        self.token.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The interceptor for the next call on `channel` (at `endpoint`), authenticating first if no
    /// token is held.
    pub(crate) async fn interceptor(
        &self, endpoint: &str, channel: &Channel, limit: Duration,
    ) -> Result<TokenInterceptor, EtcdError> {
        if let Some(token) = self.current() {
            return Ok(TokenInterceptor { token: Some(token) });
        }
        let _renewing = self.renewing.lock().await;
        if let Some(token) = self.current() {
            return Ok(TokenInterceptor { token: Some(token) });
        }
        let request =
            AuthenticateRequest { name: self.credentials.user.clone(), password: self.credentials.password.clone() };
        let answer = tokio::time::timeout(limit, AuthClient::new(channel.clone()).authenticate(request)).await;
        let response = match answer {
            Err(_) => return Err(EtcdError::Timeout(limit)),
            Ok(Err(status)) => {
                let (endpoint, message) = (endpoint.to_owned(), status.message().to_owned());
                return Err(if is_credentials_refusal(&status) {
                    EtcdError::Authentication { endpoint, user: self.credentials.user.clone(), message }
                } else {
                    EtcdError::Rpc { endpoint, code: status.code(), message }
                });
            }
            Ok(Ok(response)) => response.into_inner(),
        };
        let token = AsciiMetadataValue::try_from(response.token.as_str())
            .map_err(|_| EtcdError::Protocol("the auth token is not valid metadata".into()))?;
        tracing::debug!(user = %self.credentials.user, "etcd authentication succeeded");
        *self.token.lock().unwrap_or_else(|e| e.into_inner()) = Some(token.clone());
        Ok(TokenInterceptor { token: Some(token) })
    }

    /// Forgets the token if the server said it is no longer valid; true if so (the call may be
    /// repeated with a new token).
    pub(crate) fn refused(&self, code: Code, message: &str) -> bool {
        if !is_stale_token(code, message) {
            return false;
        }
        tracing::debug!(user = %self.credentials.user, "etcd refused the auth token; authenticating again");
        *self.token.lock().unwrap_or_else(|e| e.into_inner()) = None;
        true
    }
}

/// etcd's answers to a token it no longer knows (expired simple token, restarted server, a JWT
/// signed before a key rotation) or to a call that carries none while auth is on.
pub(crate) fn is_stale_token(code: Code, message: &str) -> bool {
    matches!(code, Code::Unauthenticated | Code::InvalidArgument)
        && (message.contains("invalid auth token") || message.contains("user name is empty"))
}

/// etcd's answer to a wrong user name or password (`ErrAuthFailed`), and to `Authenticate`
/// while auth is off (`ErrAuthNotEnabled`).
fn is_credentials_refusal(status: &tonic::Status) -> bool {
    matches!(status.code(), Code::InvalidArgument | Code::FailedPrecondition | Code::Unauthenticated)
}

/// An error's message followed by its sources' (`a: b: c`), without repeats: tonic reports a
/// failed TLS handshake as "transport error", with the reason (an unknown issuer, a refused
/// client certificate) only in the sources.
pub(crate) fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    with_sources(error.to_string(), error.source())
}

/// The server's message of `status`, or for a status made on the client side from a failed
/// connection (message "transport error") the reasons from its sources.
pub(crate) fn status_message(status: &tonic::Status) -> String {
    with_sources(status.message().to_owned(), std::error::Error::source(status))
}

fn with_sources(mut text: String, mut source: Option<&(dyn std::error::Error + 'static)>) -> String {
    while let Some(cause) = source {
        let part = cause.to_string();
        if !part.is_empty() && !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ca_bundle_must_hold_a_certificate() {
        assert!(matches!(EtcdTls::new(b"".to_vec()), Err(EtcdError::Tls(_))));
        assert!(matches!(EtcdTls::new(b"not pem at all".to_vec()), Err(EtcdError::Tls(_))));
    }

    #[test]
    fn password_never_shows_in_debug() {
        let options = EtcdOptions::new().with_user("alice", "s3cret");
        let shown = format!("{options:?}");
        assert!(shown.contains("alice") && !shown.contains("s3cret"), "{shown}");
    }

    #[test]
    fn only_token_refusals_trigger_a_new_authentication() {
        assert!(is_stale_token(Code::Unauthenticated, "etcdserver: invalid auth token"));
        assert!(!is_stale_token(
            Code::InvalidArgument,
            "etcdserver: authentication failed, invalid user ID or password"
        ));
        assert!(!is_stale_token(Code::PermissionDenied, "etcdserver: permission denied"));
    }
}
