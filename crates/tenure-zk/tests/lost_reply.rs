//! A create whose reply is lost (the connection drops after the server made the node) is not
//! repeated: after reconnecting, the candidate finds its node by its guid among the children.
//! A loopback proxy between the candidate and the server swallows the reply.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use tenure_zk::ZkElection;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const OP_CREATE: i32 = 1;
const OP_CREATE2: i32 = 15;

/// Forwards connections to `upstream`; the first create request on any connection is passed on,
/// then that connection is cut before the server's reply reaches the client.
async fn lossy_proxy(listener: TcpListener, upstream: String, armed: Arc<AtomicBool>, cut: Arc<AtomicBool>) {
    while let Ok((client, _)) = listener.accept().await {
        let Ok(server) = TcpStream::connect(&upstream).await else { continue };
        let (mut client_read, mut client_write) = client.into_split();
        let (mut server_read, mut server_write) = server.into_split();
        let blackhole = Arc::new(AtomicBool::new(false));
        let hole = blackhole.clone();
        let replies = tokio::spawn(async move {
            let mut buf = vec![0u8; 64 * 1024];
            while let Ok(n) = server_read.read(&mut buf).await {
                if n == 0 || hole.load(Ordering::SeqCst) {
                    break; // drops the reply and both halves: the client sees a lost connection
                }
                if client_write.write_all(&buf[..n]).await.is_err() {
                    break;
                }
            }
        });
        let armed = armed.clone();
        let cut = cut.clone();
        tokio::spawn(async move {
            let mut first = true;
            loop {
                let mut len = [0u8; 4];
                if client_read.read_exact(&mut len).await.is_err() {
                    break;
                }
                let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
                if client_read.read_exact(&mut body).await.is_err() {
                    break;
                }
                // Frames after the connect request start with xid and op code.
                let op =
                    if first || body.len() < 8 { 0 } else { i32::from_be_bytes([body[4], body[5], body[6], body[7]]) };
                first = false;
                let drop_reply = (op == OP_CREATE || op == OP_CREATE2) && armed.swap(false, Ordering::SeqCst);
                if drop_reply {
                    blackhole.store(true, Ordering::SeqCst);
                }
                if server_write.write_all(&len).await.is_err() || server_write.write_all(&body).await.is_err() {
                    break;
                }
                if drop_reply {
                    cut.store(true, Ordering::SeqCst);
                    break;
                }
            }
            replies.abort();
        });
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_whose_reply_was_lost_is_found_by_guid_and_not_repeated() {
    let Some(server) = server() else { return };
    let path = unique_path("lost-reply");
    let admin = zookeeper_client::Client::connect(&server.servers).await.expect("admin client");
    let options = zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all());
    admin.mkdir(&path, &options).await.expect("election path");

    let listener = TcpListener::bind("127.0.0.1:0").await.expect("proxy port");
    let proxy = listener.local_addr().expect("addr").to_string();
    let armed = Arc::new(AtomicBool::new(true));
    let cut = Arc::new(AtomicBool::new(false));
    tokio::spawn(lossy_proxy(listener, server.servers.clone(), armed, cut.clone()));

    let election = ZkElection::connect(&proxy, &path, SESSION_TIMEOUT).await.expect("connect via proxy");
    let elector = election.campaign("careful").expect("campaign");
    let tenure =
        tokio::time::timeout(Duration::from_secs(10), elector.acquired()).await.expect("leads").expect("tenure");
    assert!(cut.load(Ordering::SeqCst), "the proxy cut the connection after a create");

    let children = admin.list_children(&path).await.expect("children");
    assert_eq!(children.len(), 1, "one node, not a second one after the retry: {children:?}");
    let (_, stat) = admin.get_data(&format!("{path}/{}", children[0])).await.expect("node");
    assert_eq!(tenure.term().0, u64::try_from(stat.czxid).expect("czxid"), "leads with the node created first");
    drop(tenure);
    elector.shutdown().await.expect("shutdown");
    assert!(admin.list_children(&path).await.expect("children").is_empty());
}
