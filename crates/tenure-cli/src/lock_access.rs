//! Credentials and TLS files of an `etcd://` or `zk://` lock URL.
//!
//! Why the URL carries them: `--lock` is the one place that says where the lock is, and the same
//! election must be reachable the same way from `elect`, `run` and `status`. What the URL holds
//! is only ever a user name and file paths; a password comes from a file (`password-file=`) or
//! the environment (`TENURE_LOCK_PASSWORD`), never from the command line, where `ps` shows it.
//!
//! ```text
//! etcd://[USER@]host:port[,host:port]/NAME[?cacert=CA.pem[&cert=CERT.pem&key=KEY.pem][&servername=NAME][&password-file=PATH]]
//! zk://[USER@]host:port[,host:port]/PATH[?cacert=CA.pem[&cert=CERT.pem&key=KEY.pem]][&password-file=PATH]   (TLS: feature zk-tls)
//! ```

use std::path::{Path, PathBuf};

use tenure::redact_credentials;

pub use crate::error::PASSWORD_ENV;
use crate::error::{AccessError, LockUrlError};

/// Which backend a URL is for: they accept different parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// `etcd://`: TLS and etcd users.
    Etcd,
    /// `zk://`: digest users.
    Zk,
}

/// The access part of an `etcd://` or `zk://` URL: who to authenticate as and which TLS files to
/// use. Only names and paths: the files are read when connecting, so that a missing one is
/// reported with its path by the command that needs it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterAccess {
    /// The user (etcd user, or ZooKeeper digest user), from the URL's userinfo.
    pub user: Option<String>,
    /// `password-file=`: the user's password is this file's first line.
    pub password_file: Option<PathBuf>,
    /// `cacert=`: the CA bundle that signed the servers' certificates; turns TLS on.
    pub ca: Option<PathBuf>,
    /// `cert=` and `key=`: this client's certificate and private key.
    pub identity: Option<(PathBuf, PathBuf)>,
    /// `servername=`: the name to check the servers' certificates against.
    pub server_name: Option<String>,
}

impl ClusterAccess {
    /// Parses the userinfo (before `@`) and the query (after `?`) of a lock URL.
    pub fn parse(userinfo: Option<&str>, query: Option<&str>, backend: Backend) -> Result<Self, AccessError> {
        let mut access = ClusterAccess::default();
        if let Some(userinfo) = userinfo {
            if userinfo.contains(':') {
                return Err(AccessError::PasswordInUrl);
            }
            if userinfo.is_empty() {
                return Err(AccessError::Inconsistent("an empty user name before '@'"));
            }
            access.user = Some(userinfo.to_owned());
        }
        let (mut cert, mut key) = (None, None);
        for pair in query.unwrap_or_default().split('&').filter(|p| !p.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            let bad = |reason: &str| AccessError::BadParameter { name: name.to_owned(), reason: reason.to_owned() };
            if value.is_empty() {
                return Err(bad("it needs a value"));
            }
            let slot = match (name, backend) {
                ("password-file", _) => &mut access.password_file,
                ("cacert", Backend::Etcd) => &mut access.ca,
                ("cert", Backend::Etcd) => &mut cert,
                ("key", Backend::Etcd) => &mut key,
                ("servername", Backend::Etcd) => {
                    if access.server_name.replace(value.to_owned()).is_some() {
                        return Err(bad("it is given twice"));
                    }
                    continue;
                }
                ("cacert", Backend::Zk) if cfg!(feature = "zk-tls") => &mut access.ca,
                ("cert", Backend::Zk) if cfg!(feature = "zk-tls") => &mut cert,
                ("key", Backend::Zk) if cfg!(feature = "zk-tls") => &mut key,
                ("servername", Backend::Zk) => {
                    return Err(bad("the ZooKeeper client checks the certificate against each server's host"))
                }
                ("cacert" | "cert" | "key", Backend::Zk) => {
                    return Err(bad("ZooKeeper over TLS needs tenure built with `--features zk-tls`"))
                }
                (_, Backend::Etcd) => {
                    return Err(bad("unknown; etcd locks take cacert, cert, key, servername and password-file"))
                }
                (_, Backend::Zk) => return Err(bad("unknown; ZooKeeper locks take password-file")),
            };
            if slot.replace(PathBuf::from(value)).is_some() {
                return Err(bad("it is given twice"));
            }
        }
        access.identity = match (cert, key) {
            (Some(cert), Some(key)) => Some((cert, key)),
            (None, None) => None,
            _ => return Err(AccessError::Inconsistent("cert= and key= go together")),
        };
        if access.ca.is_none() && (access.identity.is_some() || access.server_name.is_some()) {
            return Err(AccessError::Inconsistent("cert=, key= and servername= need cacert= (TLS)"));
        }
        if access.password_file.is_some() && access.user.is_none() {
            return Err(AccessError::Inconsistent("password-file= needs a user: write USER@host:port"));
        }
        Ok(access)
    }

    /// The query string that [`ClusterAccess::parse`] reads back (for `Display`), with a leading
    /// `?`, or nothing.
    pub fn query(&self) -> String {
        let mut pairs = Vec::new();
        let mut add = |name: &str, value: &Path| pairs.push(format!("{name}={}", value.display()));
        if let Some(ca) = &self.ca {
            add("cacert", ca);
        }
        if let Some((cert, key)) = &self.identity {
            add("cert", cert);
            add("key", key);
        }
        if let Some(name) = &self.server_name {
            add("servername", Path::new(name));
        }
        if let Some(file) = &self.password_file {
            add("password-file", file);
        }
        format!("{}{}", if pairs.is_empty() { "" } else { "?" }, pairs.join("&"))
    }

    /// The user with its password (from the file or the environment), if a user is named.
    fn credentials(&self) -> Result<Option<(String, String)>, AccessError> {
        let Some(user) = &self.user else { return Ok(None) };
        let password = match &self.password_file {
            Some(path) => {
                let text = read_text(path, "password file")?;
                text.lines().next().unwrap_or_default().to_owned()
            }
            None => std::env::var(PASSWORD_ENV).map_err(|_| AccessError::NoPassword { user: user.clone() })?,
        };
        Ok(Some((user.clone(), password)))
    }

    /// The etcd client options: the files read, the password looked up.
    pub fn etcd_options(&self) -> Result<tenure_etcd::EtcdOptions, AccessError> {
        let mut options = tenure_etcd::EtcdOptions::new();
        if let Some(ca) = &self.ca {
            let tls_error = |e: tenure_etcd::EtcdError| AccessError::Tls(e.to_string());
            let mut tls = tenure_etcd::EtcdTls::new(read_bytes(ca, "CA bundle")?).map_err(tls_error)?;
            if let Some((cert, key)) = &self.identity {
                tls = tls
                    .with_client_identity(read_bytes(cert, "client certificate")?, read_bytes(key, "client key")?)
                    .map_err(tls_error)?;
            }
            if let Some(name) = &self.server_name {
                tls = tls.with_server_name(name.clone());
            }
            options = options.with_tls(tls);
        }
        if let Some((user, password)) = self.credentials()? {
            options = options.with_user(user, password);
        }
        Ok(options)
    }

    /// The ZooKeeper client options (digest credentials; TLS files with the feature `zk-tls`).
    pub fn zk_options(&self) -> Result<tenure_zk::ZkOptions, AccessError> {
        #[allow(unused_mut)]
        let mut options = tenure_zk::ZkOptions::new();
        #[cfg(feature = "zk-tls")]
        if let Some(ca) = &self.ca {
            let ca = read_text(ca, "CA bundle")?;
            let read = |(cert, key): &(PathBuf, PathBuf)| {
                Ok((read_text(cert, "client certificate")?, read_text(key, "client key")?))
            };
            let identity = self.identity.as_ref().map(read).transpose()?;
            let identity = identity.as_ref().map(|(cert, key)| (cert.as_str(), key.as_str()));
            options = options.with_tls(&ca, identity).map_err(|e| AccessError::Tls(e.to_string()))?;
        }
        Ok(match self.credentials()? {
            Some((user, password)) => options.with_digest(user, password),
            None => options,
        })
    }
}

fn read_bytes(path: &Path, what: &'static str) -> Result<Vec<u8>, AccessError> {
    std::fs::read(path).map_err(|e| AccessError::File { what, path: path.to_owned(), reason: e.to_string() })
}

fn read_text(path: &Path, what: &'static str) -> Result<String, AccessError> {
    let reason = "it is not UTF-8 text".into();
    String::from_utf8(read_bytes(path, what)?).map_err(|_| AccessError::File { what, path: path.to_owned(), reason })
}

/// Parses `//[USER@]host:port[,host:port...]/path[?query]`, what follows `scheme:` in `text`:
/// the servers, the path (without its first `/`) and the access.
pub fn parse_cluster_url(
    text: &str,
    scheme: &str,
    rest: &str,
    backend: Backend,
) -> Result<(String, String, ClusterAccess), LockUrlError> {
    let (rest, userinfo, query) = split_url(rest);
    let access = ClusterAccess::parse(userinfo, query, backend)
        .map_err(|source| LockUrlError::BadAccess { scheme: scheme.to_owned(), source })?;
    let (servers, path) = split_servers(&rest)
        .map_err(|reason| LockUrlError::BadClusterUrl { url: redact_credentials(text).into_owned(), reason })?;
    Ok((servers, path, access))
}

/// Splits `//host:port[,host:port...]/a/b` (after the scheme) into the servers and `a/b`.
fn split_servers(rest: &str) -> Result<(String, String), &'static str> {
    let Some(rest) = rest.strip_prefix("//") else { return Err("write SCHEME://host:port[,host:port]/name") };
    let Some((servers, path)) = rest.split_once('/') else { return Err("it has no election path after the servers") };
    if servers.is_empty() {
        return Err("it names no server");
    }
    for server in servers.split(',') {
        let Some((host, port)) = server.rsplit_once(':') else { return Err("every server needs a port (host:port)") };
        if host.is_empty() || port.parse::<u16>().map_or(true, |p| p == 0) {
            return Err("every server must be host:port with a port from 1 to 65535");
        }
    }
    if path.is_empty() || path.ends_with('/') || path.contains("//") || path.contains(['?', '#']) {
        return Err("the election path must be /a/b with no empty part, query or fragment");
    }
    Ok((servers.to_owned(), path.to_owned()))
}

/// Writes `scheme://[USER@]servers/path[?query]`, the servers' passwords as `***` (never a
/// password of the user: the URL does not hold one).
pub fn write_cluster_url(
    f: &mut std::fmt::Formatter<'_>,
    scheme: &str,
    servers: &str,
    path: &str,
    access: &ClusterAccess,
) -> std::fmt::Result {
    let user = access.user.as_ref().map(|user| format!("{user}@")).unwrap_or_default();
    write!(f, "{scheme}://{user}{}/{path}{}", redact_credentials(servers), access.query())
}

/// Splits `//[userinfo@]servers/path[?query]` (after the scheme) into `//servers/path`, the
/// userinfo and the query.
fn split_url(rest: &str) -> (String, Option<&str>, Option<&str>) {
    let (before_query, query) = rest.split_once('?').map_or((rest, None), |(before, query)| (before, Some(query)));
    let Some(authority_and_path) = before_query.strip_prefix("//") else {
        return (before_query.to_owned(), None, query);
    };
    let authority_end = authority_and_path.find('/').unwrap_or(authority_and_path.len());
    match authority_and_path[..authority_end].rsplit_once('@') {
        Some((userinfo, servers)) => {
            (format!("//{servers}{}", &authority_and_path[authority_end..]), Some(userinfo), query)
        }
        None => (before_query.to_owned(), None, query),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_parts_are_split_off() {
        assert_eq!(split_url("//u@h:1,h:2/a/b?x=y"), ("//h:1,h:2/a/b".into(), Some("u"), Some("x=y")));
        assert_eq!(split_url("//h:1/a"), ("//h:1/a".into(), None, None));
    }

    #[test]
    fn etcd_parameters_name_tls_files_and_a_password_file() {
        let access = ClusterAccess::parse(
            Some("app"),
            Some("cacert=/ca.pem&cert=/c.pem&key=/k.pem&servername=etcd.local&password-file=/run/pw"),
            Backend::Etcd,
        )
        .unwrap();
        assert_eq!(access.user.as_deref(), Some("app"));
        assert_eq!(access.ca, Some(PathBuf::from("/ca.pem")));
        assert_eq!(access.identity, Some((PathBuf::from("/c.pem"), PathBuf::from("/k.pem"))));
        assert_eq!(access.server_name.as_deref(), Some("etcd.local"));
        assert_eq!(
            access.query(),
            "?cacert=/ca.pem&cert=/c.pem&key=/k.pem&servername=etcd.local&password-file=/run/pw"
        );
    }

    #[test]
    fn bad_access_parts_are_refused_with_the_reason() {
        let parse = |user, query, backend| ClusterAccess::parse(user, query, backend).unwrap_err().to_string();
        assert!(parse(Some("u:secret"), None, Backend::Etcd).contains("password-file"));
        assert!(!parse(Some("u:secret"), None, Backend::Etcd).contains("secret"));
        assert!(parse(None, Some("cert=/c"), Backend::Etcd).contains("go together"));
        assert!(parse(None, Some("cert=/c&key=/k"), Backend::Etcd).contains("need cacert"));
        assert!(parse(None, Some("cacert=/a&cacert=/b"), Backend::Etcd).contains("twice"));
        assert!(parse(None, Some("cacert="), Backend::Etcd).contains("needs a value"));
        assert!(parse(None, Some("tls=1"), Backend::Etcd).contains("unknown"));
        if !cfg!(feature = "zk-tls") {
            assert!(parse(None, Some("cacert=/a"), Backend::Zk).contains("--features zk-tls"));
        }
        assert!(parse(None, Some("servername=x"), Backend::Zk).contains("each server's host"));
        assert!(parse(None, Some("password-file=/p"), Backend::Zk).contains("needs a user"));
    }

    #[test]
    fn a_missing_file_is_reported_with_its_path() {
        let access = ClusterAccess::parse(None, Some("cacert=/nonexistent/ca.pem"), Backend::Etcd).unwrap();
        let error = access.etcd_options().unwrap_err().to_string();
        assert!(error.contains("CA bundle /nonexistent/ca.pem"), "{error}");
        let access = ClusterAccess::parse(Some("u"), Some("password-file=/nonexistent/pw"), Backend::Zk).unwrap();
        let error = access.zk_options().unwrap_err().to_string();
        assert!(error.contains("password file /nonexistent/pw"), "{error}");
    }
}
