//! Paths that look like a mistyped API path (`/isleader`, `/statuz`, `/status/`) answer 404.
//!
//! Why: leader-elector:0.5 answered the leader's name on every path, and clients written for it
//! may poll any path, so tenure keeps that catch-all. But the catch-all answers 200, so a probe
//! pointed at a misspelled `/isLeader?strict` or `/healthz` would always pass and never tell the
//! operator. A path close to one of the API's own paths is therefore refused with a body naming
//! the path that was probably meant; every other path keeps the old answer.

use axum::http::{StatusCode, Uri};
use axum::Json;
use serde::Serialize;

/// The paths the API serves itself (besides `/`), as a probe or client spells them.
const API_PATHS: &[&str] = &["/isLeader", "/status", "/healthz", "/readyz", "/events", "/hold", "/metrics", "/progress"];

/// How many edits (insert, delete, substitute, swap) turn a typo into an API path at most: two,
/// or one for names shorter than six letters (`/hold`), which two edits would bring too close to
/// unrelated words.
fn max_edits(api_path: &str) -> usize {
    1 + usize::from(api_path.len() > 6)
}

/// The 404 answer to a mistyped path.
#[derive(Debug, Serialize)]
pub struct NotFound {
    /// What went wrong, for a person reading a probe's output.
    pub error: String,
    /// The API path that was probably meant.
    pub hint: &'static str,
}

/// The API path that `path` is a near miss of, if it is one: equal ignoring case or trailing
/// slashes, or within [`max_edits`] edits of it (compared in lower case).
pub fn near_miss(path: &str) -> Option<&'static str> {
    let typed = path.trim_end_matches('/').to_ascii_lowercase();
    if typed.is_empty() {
        return None;
    }
    API_PATHS.iter().copied().find(|api| {
        let api_lower = api.to_ascii_lowercase();
        // Paths under an API path (`/status/x`) are typos too: the API has no sub-paths.
        typed.starts_with(&format!("{api_lower}/")) || edit_distance(&typed, &api_lower) <= max_edits(api)
    })
}

/// The 404 answer for `uri` if its path is a near miss of an API path.
pub fn refuse_typo(uri: &Uri) -> Option<(StatusCode, Json<NotFound>)> {
    let meant = near_miss(uri.path())?;
    let answer = NotFound {
        error: format!("no such path {}; paths are case-sensitive and have no trailing slash", uri.path()),
        hint: meant,
    };
    Some((StatusCode::NOT_FOUND, Json(answer)))
}

/// Optimal string alignment distance (Levenshtein plus adjacent swaps) between two short ASCII
/// strings; other characters count as one unit each.
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    // rows[i][j]: distance between the first i characters of a and the first j of b.
    let mut rows = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in rows.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in rows[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let substitution = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (rows[i - 1][j] + 1).min(rows[i][j - 1] + 1).min(rows[i - 1][j - 1] + substitution);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(rows[i - 2][j - 2] + 1);
            }
            rows[i][j] = best;
        }
    }
    rows[a.len()][b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn near_misses_of_api_paths_are_recognised() {
        for (typed, meant) in [
            ("/isleader", "/isLeader"),
            ("/IsLeader", "/isLeader"),
            ("/isLeader/", "/isLeader"),
            ("/statuz", "/status"),
            ("/status/", "/status"),
            ("/status/leader", "/status"),
            ("/helthz", "/healthz"),
            ("/healthy", "/healthz"),
            ("/metric", "/metrics"),
            ("/evnets", "/events"),
            ("/leader", "/isLeader"),
            ("/hodl", "/hold"),
        ] {
            assert_eq!(near_miss(typed), Some(meant), "{typed}");
        }
    }

    #[test]
    fn unrelated_paths_are_not_typos() {
        for path in ["/", "/anything/at/all", "/x", "/name", "/kuryr-controller", "/help"] {
            assert_eq!(near_miss(path), None, "{path}");
        }
    }

    #[test]
    fn edit_distance_counts_swaps_as_one_edit() {
        assert_eq!(edit_distance("events", "evnets"), 1);
        assert_eq!(edit_distance("status", "statuz"), 1);
        assert_eq!(edit_distance("", "abc"), 3);
    }
}
