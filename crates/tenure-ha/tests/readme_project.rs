//! The READMEs' programs built as a user builds them: a fresh project outside this workspace,
//! with a README's dependency block and `src/main.rs` copied verbatim (the library example of the
//! top README, the controller of crates/tenure-ha/README.md). A dependency block that names a wrong feature, a k8s-openapi version that kube does
//! not use, or a missing crate fails here, not in a user's first hour.
//!
//! The project gets this workspace's `Cargo.lock` (so the build uses the crate versions this
//! workspace is tested with, and needs nothing that is not already downloaded) and a target
//! directory of its own under `target/`.

use std::path::{Path, PathBuf};
use std::process::Command;

fn repository_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("the repository root")
}

/// The fenced block that follows `<!-- KIND: NAME -->`.
fn example_block(readme: &str, kind: &str, name: &str) -> String {
    let marker = format!("<!-- {kind}: {name} -->");
    let after = readme.split_once(&marker).unwrap_or_else(|| panic!("the README marks {name}")).1;
    let mut lines = after.lines().skip_while(|l| l.trim().is_empty());
    let fence = lines.next().expect("a fenced block after the marker");
    assert!(fence.starts_with("```"), "{name}: a fenced block follows the marker, not {fence:?}");
    lines.take_while(|l| l.trim() != "```").map(|l| format!("{l}\n")).collect()
}

#[test]
fn the_readme_programs_build_in_a_fresh_project_with_their_readme_dependency_blocks() {
    // One after the other, in one target directory: the second reuses most of the first.
    build_fresh_project("README.md", "library-example");
    build_fresh_project("crates/tenure-ha/README.md", "controller-example");
}

fn build_fresh_project(readme: &str, kind: &str) {
    let root = repository_root();
    let readme = std::fs::read_to_string(root.join(readme)).expect("the README");
    let dependencies = example_block(&readme, kind, "Cargo.toml");
    let main = example_block(&readme, kind, "src/main.rs");

    // The README's paths are relative to a project next to a checkout named `tenure`.
    let scratch = root.join("target/readme-project");
    let _ = std::fs::remove_dir_all(scratch.join("controller"));
    std::fs::create_dir_all(scratch.join("controller/src")).expect("the project directory");
    let checkout = scratch.join("tenure");
    if std::fs::symlink_metadata(&checkout).is_err() {
        std::os::unix::fs::symlink(&root, &checkout).expect("a link to the checkout");
    }
    let manifest = format!(
        "[package]\nname = \"readme-controller\"\nversion = \"0.1.0\"\nedition = \"2021\"\npublish = false\n\n\
         # Not part of any workspace above it.\n[workspace]\n\n{dependencies}"
    );
    std::fs::write(scratch.join("controller/Cargo.toml"), manifest).expect("Cargo.toml");
    std::fs::write(scratch.join("controller/src/main.rs"), main).expect("src/main.rs");
    std::fs::copy(root.join("Cargo.lock"), scratch.join("controller/Cargo.lock")).expect("Cargo.lock");

    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let output = Command::new(cargo)
        .args(["check", "--quiet", "--offline"])
        .current_dir(scratch.join("controller"))
        .env("CARGO_TARGET_DIR", scratch.join("target"))
        .env_remove("RUSTFLAGS")
        .output()
        .expect("run cargo");
    assert!(
        output.status.success(),
        "the {kind} of the README does not build as written:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}
