//! The workspace's `rust-version` is true: no crate it builds (its own or a dependency, at the
//! versions of `Cargo.lock`, any feature) declares a newer one. Uses of the standard library newer
//! than it are caught by clippy's `incompatible_msrv` lint, which CI runs with `-D warnings`.

use std::path::Path;
use std::process::Command;

fn version(text: &str) -> (u64, u64, u64) {
    let mut parts = text.split('.').map(|p| p.parse::<u64>().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0), parts.next().unwrap_or(0))
}

#[test]
fn no_crate_in_the_build_needs_a_newer_rust_than_the_workspace_declares() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let rustc = Command::new(std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into()))
        .arg("-vV")
        .output()
        .expect("run rustc -vV");
    let rustc = String::from_utf8_lossy(&rustc.stdout).into_owned();
    let host = rustc.lines().find_map(|l| l.strip_prefix("host: ")).expect("rustc names its host");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    // The crates built here (this host's); other platforms' crates are not downloaded.
    let output = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--all-features", "--locked", "--offline"])
        .args(["--filter-platform", host])
        .current_dir(&root)
        .output()
        .expect("run cargo metadata");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let metadata: serde_json::Value = serde_json::from_slice(&output.stdout).expect("cargo metadata's JSON");
    let declared = env!("CARGO_PKG_RUST_VERSION");
    assert!(!declared.is_empty(), "the workspace declares a rust-version");
    let in_build: Vec<&str> = metadata["resolve"]["nodes"]
        .as_array()
        .expect("a resolve graph")
        .iter()
        .filter_map(|node| node["id"].as_str())
        .collect();
    let newer: Vec<String> = metadata["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .filter(|p| p["id"].as_str().is_some_and(|id| in_build.contains(&id)))
        .filter_map(|p| Some((p["name"].as_str()?, p["version"].as_str()?, p["rust_version"].as_str()?)))
        .filter(|(_, _, needs)| version(needs) > version(declared))
        .map(|(name, v, needs)| format!("{name} {v} needs Rust {needs}"))
        .collect();
    assert!(newer.is_empty(), "rust-version is {declared}, but: {newer:?}");
}
