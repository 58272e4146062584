//! The HTTP answer of `tenure elect --http`: who leads, as leader-elector:0.5 answered it.
//!
//! Why its own module: this is the sidecar's API, and it grows (is-leader probe, status, push
//! notifications, metrics) independently of how the election runs. Handlers only read the
//! leadership that the elector publishes on its watch channel, so they never touch the lock and
//! followers answer with the current holder the moment it changes.

use std::future::Future;

use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use serde::Serialize;
use tenure::Leadership;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// leader-elector's answer: `{"name":"<leader>"}`, `""` while nobody is known to lead.
#[derive(Debug, Serialize)]
pub struct LeaderName {
    /// Identity of the current holder of the lock.
    pub name: String,
}

/// The routes of the sidecar API, answering from `leadership`.
///
/// `GET` on any path answers the leader's name, because leader-elector:0.5 did and clients
/// written for it may poll any path. Other methods get 405.
pub fn router(leadership: watch::Receiver<Leadership>) -> Router {
    Router::new()
        .route("/", get(leader_name))
        .route("/*path", get(leader_name))
        .with_state(leadership)
}

async fn leader_name(State(leadership): State<watch::Receiver<Leadership>>) -> Json<LeaderName> {
    let name = leadership.borrow().leader.clone().unwrap_or_default();
    Json(LeaderName { name })
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
    use tenure::{Role, Term};

    #[test]
    fn answers_like_leader_elector() {
        let json = serde_json::to_string(&LeaderName { name: "a".into() }).unwrap();
        assert_eq!(json, r#"{"name":"a"}"#);
    }

    #[tokio::test]
    async fn any_get_path_answers_the_current_leader() {
        let (publish, leadership) = watch::channel(Leadership::unknown());
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let server = tokio::spawn(serve(listener, router(leadership), std::future::pending()));
        assert_eq!(get_body(address, "/").await, r#"{"name":""}"#);
        publish
            .send(Leadership { leader: Some("replica-b".into()), term: Some(Term(3)), role: Role::Follower })
            .unwrap();
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
