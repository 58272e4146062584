//! The HTTP answer of `tenure elect --http`: who leads, as leader-elector:0.5 answered it.
//!
//! Why its own module: this is the sidecar's API, and it grows (is-leader probe, status, push
//! notifications, metrics) independently of how the election runs. Handlers only read what the
//! elector publishes on its watch channel, plus its self-fencing check, so they never touch the
//! lock and followers answer with the current holder the moment it changes.

use std::future::Future;
use std::sync::Weak;

use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use serde::Serialize;
use tenure::{Elector, Leadership};
use tokio::net::TcpListener;

/// leader-elector's answer: `{"name":"<leader>"}`, `""` while nobody is known to lead.
#[derive(Debug, Serialize)]
pub struct LeaderName {
    /// Identity of the current holder of the lock.
    pub name: String,
}

/// What the handlers read: the elector's published leadership, and its self-fencing check.
pub trait LeadershipView: Send + Sync + 'static {
    /// The latest snapshot (holder as last observed in the lock).
    fn leadership(&self) -> Leadership;
    /// This candidate's identity.
    fn identity(&self) -> &str;
    /// True while this instance's tenure is valid on its own clock (self-fencing).
    fn leads_now(&self) -> bool;
}

impl LeadershipView for Elector {
    fn leadership(&self) -> Leadership {
        Elector::leadership(self)
    }
    fn identity(&self) -> &str {
        Elector::identity(self)
    }
    fn leads_now(&self) -> bool {
        self.is_leader().is_some()
    }
}

/// The routes of the sidecar API, answering from `view`.
///
/// `GET` on any path answers the leader's name, because leader-elector:0.5 did and clients
/// written for it may poll any path. Other methods get 405. The view is held weakly so that the
/// owner can take the elector back for its shutdown while connections are still open; once it
/// is gone, the answer is "" (unknown).
pub fn router(view: Weak<dyn LeadershipView>) -> Router {
    Router::new().route("/", get(leader_name)).route("/*path", get(leader_name)).with_state(view)
}

async fn leader_name(State(view): State<Weak<dyn LeadershipView>>) -> Json<LeaderName> {
    // The strong reference lives only for this synchronous call, never across an await.
    let name = view.upgrade().map(|view| current_leader(view.as_ref())).unwrap_or_default();
    Json(LeaderName { name })
}

/// The holder of the lock as last observed, except that this instance never names itself once
/// its tenure has lapsed on its own clock: after a pause (SIGSTOP, a long GC) the snapshot may
/// still name it until the elector has looked at the lock again, and an application asking its
/// sidecar "who leads?" must not act on that. It answers "" (unknown) until the elector knows.
fn current_leader(view: &dyn LeadershipView) -> String {
    match view.leadership().leader {
        Some(name) if name == view.identity() && !view.leads_now() => String::new(),
        Some(name) => name,
        None => String::new(),
    }
}

/// Serves `router` on `listener` until `shutdown` completes.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router).with_graceful_shutdown(shutdown).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use tenure::{Role, Term};

    struct FakeView {
        leadership: Mutex<Leadership>,
        leads: Mutex<bool>,
    }

    impl LeadershipView for FakeView {
        fn leadership(&self) -> Leadership {
            self.leadership.lock().unwrap().clone()
        }
        fn identity(&self) -> &str {
            "me"
        }
        fn leads_now(&self) -> bool {
            *self.leads.lock().unwrap()
        }
    }

    fn held_by(leader: &str) -> Leadership {
        Leadership { leader: Some(leader.into()), term: Some(Term(3)), role: Role::Follower }
    }

    #[test]
    fn answers_like_leader_elector() {
        let json = serde_json::to_string(&LeaderName { name: "a".into() }).unwrap();
        assert_eq!(json, r#"{"name":"a"}"#);
    }

    #[test]
    fn never_names_itself_after_its_tenure_lapsed() {
        let view = FakeView { leadership: Mutex::new(held_by("me")), leads: Mutex::new(true) };
        assert_eq!(current_leader(&view), "me");
        *view.leads.lock().unwrap() = false;
        assert_eq!(current_leader(&view), "");
        *view.leadership.lock().unwrap() = held_by("other");
        assert_eq!(current_leader(&view), "other");
    }

    #[tokio::test]
    async fn any_get_path_answers_the_current_leader() {
        let view = Arc::new(FakeView { leadership: Mutex::new(Leadership::unknown()), leads: Mutex::new(false) });
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let weak: Weak<FakeView> = Arc::downgrade(&view);
        let server = tokio::spawn(serve(listener, router(weak), std::future::pending()));
        assert_eq!(get_body(address, "/").await, r#"{"name":""}"#);
        *view.leadership.lock().unwrap() = held_by("replica-b");
        assert_eq!(get_body(address, "/anything/at/all").await, r#"{"name":"replica-b"}"#);
        server.abort();
    }

    async fn get_body(address: std::net::SocketAddr, path: &str) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
        let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
        assert!(response.to_ascii_lowercase().contains("content-type: application/json"), "{response}");
        response.split("\r\n\r\n").nth(1).unwrap().to_owned()
    }
}
