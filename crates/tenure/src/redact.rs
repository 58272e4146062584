//! Passwords out of everything a person or a collector reads.
//!
//! Why in the core: a server list or lock URL may carry `user:password@` (RFC 3986 user
//! information), and it reaches errors, log lines, `/status` and metrics labels through every
//! backend crate and the CLI. One function, used wherever an endpoint or URL is formatted, keeps
//! the rule the same everywhere: the user stays (it helps to tell which account failed), the
//! password becomes `***`.

use std::borrow::Cow;

/// `text` (an endpoint, a `host:port,host:port` list or a URL) with the password of every
/// `user:password@` replaced by `***`. Text without `@` comes back borrowed, unchanged.
///
/// Servers are split at commas and each server's user information ends at its last `@`, so a
/// password may contain `@` and `:` but must percent-encode `,` and `/`, as RFC 3986 asks. When
/// in doubt the function hides more rather than less.
///
/// ```
/// use tenure::redact_credentials;
/// assert_eq!(redact_credentials("etcd://me:s3cret@10.0.0.1:2379/job"), "etcd://me:***@10.0.0.1:2379/job");
/// assert_eq!(redact_credentials("127.0.0.1:2379"), "127.0.0.1:2379");
/// ```
pub fn redact_credentials(text: &str) -> Cow<'_, str> {
    each_server(text, |server| match server.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _password)) => format!("{user}:***@{host}"),
            // A user name alone is no secret.
            None => server.to_owned(),
        },
        None => server.to_owned(),
    })
}

/// `text` (an endpoint, a server list or a URL) without any `user:password@`, for the address a
/// client connects to. Why: a backend that does not authenticate with them must not send them
/// anyway (an HTTP/2 authority carries user information to the server in clear text) nor hand
/// them to a client library that logs its server list.
///
/// ```
/// use tenure::redact::without_credentials;
/// assert_eq!(without_credentials("http://me:s3cret@10.0.0.1:2379"), "http://10.0.0.1:2379");
/// ```
pub fn without_credentials(text: &str) -> Cow<'_, str> {
    each_server(text, |server| server.rsplit_once('@').map_or(server, |(_, host)| host).to_owned())
}

/// `text` with every server of its comma-separated list (after any `scheme://`) rewritten by
/// `rewrite`; borrowed, unchanged, when it holds no `@` and so no user information.
fn each_server(text: &str, rewrite: impl Fn(&str) -> String) -> Cow<'_, str> {
    if !text.contains('@') {
        return Cow::Borrowed(text);
    }
    let (scheme, rest) = match text.find("://") {
        Some(index) => text.split_at(index + 3),
        None => ("", text),
    };
    let servers: Vec<String> = rest.split(',').map(rewrite).collect();
    Cow::Owned(format!("{scheme}{}", servers.join(",")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_replaced_and_everything_else_stays() {
        let cases = [
            ("etcd://user:pw@host:2379/x", "etcd://user:***@host:2379/x"),
            ("user:pw@host:2379", "user:***@host:2379"),
            ("http://user:pw@127.0.0.1:2379", "http://user:***@127.0.0.1:2379"),
            ("a:1@h1:1,b:2@h2:2/e", "a:***@h1:1,b:***@h2:2/e"),
            ("user:p@ss:w@rd@host:1/x", "user:***@host:1/x"),
            ("zk://u:pw@[::1]:2181/a/b", "zk://u:***@[::1]:2181/a/b"),
            ("user@host:1/x", "user@host:1/x"),
            ("etcd://h:1,h:2/x", "etcd://h:1,h:2/x"),
            ("file:///tmp/x", "file:///tmp/x"),
        ];
        for (given, shown) in cases {
            assert_eq!(redact_credentials(given), shown, "{given}");
        }
    }

    #[test]
    fn credentials_are_left_out_of_addresses() {
        assert_eq!(without_credentials("u:p@127.0.0.1:2379"), "127.0.0.1:2379");
        assert_eq!(without_credentials("http://u:p@w@h:1"), "http://h:1");
        assert_eq!(without_credentials("a:1@h1:1,h2:2,b@h3:3"), "h1:1,h2:2,h3:3");
        assert_eq!(without_credentials("http://h:1"), "http://h:1");
    }

    #[test]
    fn no_password_survives_whatever_its_characters() {
        for password in ["s3cret", "p@ss", "p:a:ss", "%2Fslash", "ümlaut"] {
            let url = format!("etcd://admin:{password}@127.0.0.1:2379,admin:{password}@127.0.0.2:2379/job");
            let shown = redact_credentials(&url);
            assert!(!shown.contains(password), "{shown}");
            assert!(shown.contains("admin:***@127.0.0.1:2379"), "{shown}");
        }
    }
}
