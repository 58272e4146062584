//! The README's Rust snippets are programs that compile: each one is, verbatim, an example under
//! `crates/*/examples/` (which `cargo build --all-targets` builds), minus the example's `//!`
//! header. A snippet edited in the README alone, or an example changed without the README,
//! fails here with the snippet to fix.

use std::path::{Path, PathBuf};

fn repository_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The body of every ```rust block of `markdown`.
fn rust_blocks(markdown: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in markdown.lines() {
        match &mut current {
            None if line.trim_start() == "```rust" => current = Some(String::new()),
            None => {}
            Some(_) if line.trim_start() == "```" => blocks.extend(current.take()),
            Some(block) => {
                block.push_str(line);
                block.push('\n');
            }
        }
    }
    assert!(current.is_none(), "a ```rust block is not closed");
    blocks
}

/// (path, text without the leading `//!` lines) of every example of the workspace.
fn examples() -> Vec<(PathBuf, String)> {
    let crates = std::fs::read_dir(repository_root().join("crates")).expect("the crates directory");
    let mut examples = Vec::new();
    for krate in crates.map(|entry| entry.expect("a directory entry").path()) {
        let Ok(files) = std::fs::read_dir(krate.join("examples")) else { continue };
        for path in files.map(|entry| entry.expect("a directory entry").path()) {
            if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).expect("a readable example");
                let body: String = text
                    .lines()
                    .skip_while(|line| line.starts_with("//!"))
                    .skip_while(|line| line.is_empty())
                    .map(|line| format!("{line}\n"))
                    .collect();
                examples.push((path, body));
            }
        }
    }
    examples
}

#[test]
fn every_rust_snippet_of_the_readme_is_an_example_that_cargo_builds() {
    let readme = std::fs::read_to_string(repository_root().join("README.md")).expect("README.md");
    let snippets = rust_blocks(&readme);
    assert!(snippets.len() >= 4, "the file, Kubernetes, etcd and ZooKeeper forms: found {}", snippets.len());
    let examples = examples();
    for snippet in &snippets {
        let found = examples.iter().find(|(_, body)| body == snippet);
        let (path, _) = found.unwrap_or_else(|| {
            panic!(
                "this README snippet is not the text of any crates/*/examples/*.rs (after its //! header):\n{snippet}"
            )
        });
        let relative = path.strip_prefix(repository_root()).unwrap_or(path);
        let name = relative.display().to_string();
        assert!(readme.contains(&name), "the README names the example {name} it shows");
    }
}
