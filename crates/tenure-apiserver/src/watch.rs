//! Serving a watch: the stream of `{"type": ..., "object": ...}` lines a watch request answers with,
//! filtered by the request's selectors, with bookmarks if asked, ended by its timeout, by server
//! shutdown, or by a partition of its client.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::errors::ApiError;
use crate::faults::Faults;
use crate::metadata_only;
use crate::resources::ResourceType;
use crate::selectors::Selectors;
use crate::store::{ChangeType, Store, WatchMessage, WatchStart};
use crate::table;

/// Everything one watch request asked for.
pub struct WatchRequest {
    /// The type watched.
    pub resource: &'static ResourceType,
    /// One namespace, or all.
    pub namespace: Option<String>,
    /// Only objects passing these.
    pub selectors: Selectors,
    /// Where to start.
    pub start: WatchStart,
    /// Whether the client asked for bookmarks (`allowWatchBookmarks=true`).
    pub bookmarks: bool,
    /// When to end the stream (`timeoutSeconds`, or the server's default).
    pub timeout: Duration,
    /// The client, so that a partition can cut it off.
    pub client: String,
    /// Whether the client asked for `Table` objects (`kubectl get -w`): each event then carries
    /// a one-row Table, the first with the column definitions, the rest without (as the real
    /// server sends them, to save bandwidth; kubectl keeps the columns it was given first).
    pub as_table: bool,
    /// Whether the client asked for `PartialObjectMetadata` objects (a metadata-only watch):
    /// each event then carries the object's metadata alone.
    pub as_metadata: bool,
}

/// How the objects of a watch's events are encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Encoding {
    /// The objects themselves.
    Objects,
    /// One-row Tables; `headers_sent` once the first carried the column definitions.
    Table { headers_sent: bool },
    /// `PartialObjectMetadata`: the objects' metadata alone.
    Metadata,
}

/// One watch event line.
fn event_line(event_type: &str, object: &Value) -> Bytes {
    event_line_of(event_type, &serde_json::to_vec(object).unwrap_or_default())
}

/// One watch event line around an object already encoded as JSON.
fn event_line_of(event_type: &str, object_json: &[u8]) -> Bytes {
    let mut line = Vec::with_capacity(object_json.len() + 32);
    line.extend_from_slice(br#"{"type":""#);
    line.extend_from_slice(event_type.as_bytes());
    line.extend_from_slice(br#"","object":"#);
    line.extend_from_slice(object_json);
    line.extend_from_slice(b"}\n");
    Bytes::from(line)
}

/// The event a change is to a watch with `selectors`, if any: an object that starts passing the
/// selectors is `ADDED` to it, one that stops passing them is `DELETED` from it.
fn event_for(
    message: &WatchMessage,
    resource: &ResourceType,
    selectors: &Selectors,
    encoding: &mut Encoding,
) -> Option<Bytes> {
    let change = match message {
        WatchMessage::Bookmark(version) => {
            let object = json!({
                "kind": resource.kind,
                "apiVersion": resource.api_version(),
                "metadata": {"resourceVersion": version.to_string()},
            });
            return Some(event_line("BOOKMARK", &object));
        }
        WatchMessage::Change(change) => change,
    };
    let now = selectors.matches(&change.object);
    let before = change.previous.as_deref().is_some_and(|p| selectors.matches(p));
    let event_type = match change.change_type {
        ChangeType::Deleted if before => "DELETED",
        ChangeType::Deleted => return None,
        ChangeType::Added if now => "ADDED",
        ChangeType::Modified if now && before => "MODIFIED",
        ChangeType::Modified if now => "ADDED",
        ChangeType::Modified if before => "DELETED",
        _ => return None,
    };
    match encoding {
        Encoding::Objects => Some(event_line_of(event_type, change.object_json())),
        Encoding::Metadata => Some(event_line(event_type, &metadata_only::partial(&change.object))),
        Encoding::Table { headers_sent } => {
            let mut table =
                table::render(resource, std::slice::from_ref(&change.object), &change.resource_version.to_string());
            if *headers_sent {
                table["columnDefinitions"] = json!([]);
            }
            *headers_sent = true;
            Some(event_line(event_type, &table))
        }
    }
}

/// Opens the watch and returns the response body streaming it. A start older than the event log
/// keeps is answered in-stream with an `ERROR` event carrying `410 Expired`, as the real server does.
pub fn serve(store: &Arc<Store>, faults: &Faults, shutdown: &CancellationToken, request: WatchRequest) -> Body {
    let (sender, receiver) = mpsc::channel::<Result<Bytes, Infallible>>(64);
    let opened = store.watch(request.resource, request.namespace.clone(), request.start, request.bookmarks);
    let mut partitions = faults.partition_changes();
    let faults = faults.clone();
    let shutdown = shutdown.clone();
    tokio::spawn(async move {
        let (first, mut changes) = match opened {
            Ok(opened) => opened,
            Err(error) => {
                let _ = sender.send(Ok(event_line("ERROR", &error.to_status()))).await;
                return;
            }
        };
        let deadline = tokio::time::sleep(request.timeout);
        tokio::pin!(deadline);
        // Ends the watch when it times out, the server stops or its client is cut off, also while
        // a client that stopped reading keeps a send waiting.
        let ended = async {
            loop {
                tokio::select! {
                    changed = partitions.changed() => {
                        if changed.is_err() || faults.is_partitioned(&request.client) {
                            return;
                        }
                    }
                    _ = &mut deadline => return,
                    _ = shutdown.cancelled() => return,
                }
            }
        };
        let mut encoding = match (request.as_table, request.as_metadata) {
            (true, _) => Encoding::Table { headers_sent: false },
            (false, true) => Encoding::Metadata,
            (false, false) => Encoding::Objects,
        };
        let stream = async {
            for message in &first {
                if let Some(line) = event_for(message, request.resource, &request.selectors, &mut encoding) {
                    if sender.send(Ok(line)).await.is_err() {
                        return;
                    }
                }
            }
            while let Some(message) = changes.recv().await {
                if let Some(line) = event_for(&message, request.resource, &request.selectors, &mut encoding) {
                    if sender.send(Ok(line)).await.is_err() {
                        return;
                    }
                }
            }
        };
        tokio::select! {
            () = ended => {}
            () = stream => {}
        }
    });
    Body::from_stream(futures::stream::unfold(receiver, |mut receiver| async move {
        receiver.recv().await.map(|item| (item, receiver))
    }))
}

/// Parses a watch's `resourceVersion` parameter: absent or `0` starts from the current state.
pub fn start_from(resource_version: Option<&str>) -> Result<WatchStart, ApiError> {
    match resource_version.unwrap_or("") {
        "" | "0" => Ok(WatchStart::CurrentState),
        text => text
            .parse()
            .map(WatchStart::After)
            .map_err(|_| ApiError::bad_request(format!("invalid resourceVersion {text:?}: not a number"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::selectors::FieldSelector;
    use crate::store::Change;

    fn change(change_type: ChangeType, object: Value, previous: Option<Value>) -> WatchMessage {
        WatchMessage::Change(Arc::new(Change {
            resource_version: 7,
            resource: crate::resources::namespaces(),
            namespace: String::new(),
            change_type,
            object: Arc::new(object),
            previous: previous.map(Arc::new),
            encoded: Default::default(),
        }))
    }

    fn event_type(message: &WatchMessage, selectors: &Selectors) -> Option<String> {
        let line = event_for(message, crate::resources::namespaces(), selectors, &mut Encoding::Objects)?;
        let value: Value = serde_json::from_slice(&line).ok()?;
        value["type"].as_str().map(str::to_string)
    }

    #[test]
    fn objects_entering_and_leaving_a_selector_are_added_and_deleted() {
        let selectors = Selectors { fields: FieldSelector::parse("metadata.name=a").unwrap(), ..Selectors::default() };
        let a = json!({"metadata": {"name": "a"}});
        let b = json!({"metadata": {"name": "b"}});
        assert_eq!(event_type(&change(ChangeType::Added, a.clone(), None), &selectors).as_deref(), Some("ADDED"));
        assert_eq!(event_type(&change(ChangeType::Added, b.clone(), None), &selectors), None);
        assert_eq!(
            event_type(&change(ChangeType::Modified, a.clone(), Some(a.clone())), &selectors).as_deref(),
            Some("MODIFIED")
        );
        assert_eq!(
            event_type(&change(ChangeType::Modified, a.clone(), Some(b.clone())), &selectors).as_deref(),
            Some("ADDED")
        );
        assert_eq!(
            event_type(&change(ChangeType::Modified, b.clone(), Some(a.clone())), &selectors).as_deref(),
            Some("DELETED")
        );
        assert_eq!(
            event_type(&change(ChangeType::Deleted, a.clone(), Some(a.clone())), &selectors).as_deref(),
            Some("DELETED")
        );
        assert_eq!(event_type(&change(ChangeType::Deleted, b.clone(), Some(b)), &selectors), None);
        assert_eq!(event_type(&WatchMessage::Bookmark(9), &selectors).as_deref(), Some("BOOKMARK"));
        assert_eq!(start_from(Some("0")).ok(), Some(WatchStart::CurrentState));
        assert_eq!(start_from(Some("12")).ok(), Some(WatchStart::After(12)));
        assert!(start_from(Some("x")).is_err());
    }

    #[test]
    fn table_watches_carry_one_row_tables_with_the_columns_only_in_the_first() {
        let lease = crate::resources::find_resource_type("coordination.k8s.io", "v1", "leases").unwrap();
        let object = json!({"metadata": {"name": "x"}, "spec": {"holderIdentity": "pod-a"}});
        let mut encoding = Encoding::Table { headers_sent: false };
        let next = |encoding: &mut Encoding| -> Value {
            let line =
                event_for(&change(ChangeType::Added, object.clone(), None), lease, &Selectors::default(), encoding);
            serde_json::from_slice(&line.unwrap()).unwrap()
        };
        let first = next(&mut encoding);
        assert_eq!(first["object"]["kind"], "Table");
        assert_eq!(first["object"]["columnDefinitions"][1]["name"], "Holder");
        assert_eq!(first["object"]["rows"][0]["cells"][1], "pod-a");
        let second = next(&mut encoding);
        assert_eq!(second["object"]["columnDefinitions"], json!([]));
        assert_eq!(second["object"]["rows"][0]["cells"][1], "pod-a", "the holder stays in every row");
    }
}
