//! Which functions the steady state of `tenure elect` runs, and the linker script that lays them
//! out together (`crates/tenure-cli/steady-state.ld`, read by `crates/tenure-cli/build.rs`).
//!
//! Why: see that build script. This module turns callgrind's record of an idle leader and
//! follower into the script; `src/bin/steady-state-layout.rs` runs them.
//!
//! Each recorded function is listed twice in the script: first by its exact symbol, then by a
//! pattern without the parts of the symbol that change from one build to another (the hash of a
//! Rust legacy symbol, the crate disambiguators of a v0 symbol, LLVM's numeric suffixes). In a
//! build like the recorded one, exact names place exactly the recorded functions first; after a
//! change of toolchain or dependency versions, the patterns still gather those functions (with
//! their other instantiations) in the same section, so the layout degrades instead of vanishing
//! until it is recorded again.

use std::collections::{BTreeSet, HashMap};

/// Names of the functions of `object` that a callgrind output file (`--demangle=no`) says ran.
///
/// Callgrind writes an object or function name once, with an id, and the id alone afterwards;
/// `ob=` sets the object of the `fn=` lines that follow (`cob=`/`cfn=` name callees and do not).
/// Objects callgrind could not name are written `???`: their Rust symbols are kept too.
pub fn functions_run(callgrind_out: &str, object: &str) -> BTreeSet<String> {
    let mut objects: HashMap<String, String> = HashMap::new();
    let mut functions: HashMap<String, String> = HashMap::new();
    let mut current_object = String::new();
    let mut run = BTreeSet::new();
    for line in callgrind_out.lines() {
        let Some((key, rest)) = line.split_once('=') else { continue };
        if !matches!(key, "ob" | "cob" | "fn" | "cfn") {
            continue;
        }
        let Some(rest) = rest.strip_prefix('(') else { continue };
        let Some((id, name)) = rest.split_once(')') else { continue };
        let name = name.trim();
        let table = if key.ends_with("ob") { &mut objects } else { &mut functions };
        if !name.is_empty() {
            table.insert(id.to_owned(), name.to_owned());
        }
        let Some(named) = table.get(id).cloned() else { continue };
        match key {
            "ob" => current_object = named,
            // Code callgrind could not name is written as its address: no section to place.
            "fn" if named.starts_with("0x") => {}
            "fn" if current_object == object || (current_object == "???" && is_rust_symbol(&named)) => {
                // A trailing `'N` marks a recursion level, not another function.
                let base = named.split_once('\'').map_or(named.as_str(), |(base, _)| base);
                run.insert(base.to_owned());
            }
            _ => {}
        }
    }
    run
}

fn is_rust_symbol(name: &str) -> bool {
    name.starts_with("_ZN") || name.starts_with("_R")
}

/// The pattern that finds `symbol` in a later build: legacy hash, v0 crate disambiguators and
/// LLVM suffixes (`.llvm.N`, `.N`) replaced by `*`. `None` for a name unusable in a linker
/// script (glob characters, spaces), which is then left out.
pub fn stable_pattern(symbol: &str) -> Option<String> {
    if !usable(symbol) {
        return None;
    }
    if let Some(path) = legacy_path(symbol) {
        return Some(format!("{path}17h*"));
    }
    if symbol.starts_with("_R") {
        // v0 symbols have no '.' of their own: one starts an LLVM suffix, which a later build
        // may add, drop or renumber.
        let name = symbol.split_once('.').map_or(symbol, |(name, _)| name);
        return Some(format!("{}*", without_crate_disambiguators(name)));
    }
    Some(symbol.to_owned())
}

/// The path of a legacy symbol `_ZN<path>17h<16 hex digits>E[suffix]`: what precedes its hash.
fn legacy_path(symbol: &str) -> Option<&str> {
    if !symbol.starts_with("_ZN") {
        return None;
    }
    let bytes = symbol.as_bytes();
    (0..symbol.len().saturating_sub(19)).rev().find_map(|at| {
        let hash = &bytes[at + 3..at + 19];
        let is_hash = &bytes[at..at + 3] == b"17h" && hash.iter().all(u8::is_ascii_hexdigit) && bytes[at + 19] == b'E';
        is_hash.then(|| &symbol[..at])
    })
}

/// A v0 symbol with every crate root `Cs<disambiguator>_<len><crate>` turned into `Cs*_<len><crate>`.
fn without_crate_disambiguators(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut rest = name;
    while let Some(at) = rest.find("Cs") {
        out.push_str(&rest[..at + 2]);
        let after = &rest[at + 2..];
        let digits = after.bytes().take_while(u8::is_ascii_alphanumeric).count();
        let disambiguated = digits > 0
            && after[digits..].starts_with('_')
            && after[digits + 1..].bytes().next().is_some_and(|b| b.is_ascii_digit());
        if disambiguated {
            out.push_str("*_");
            rest = &after[digits + 1..];
        } else {
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

fn usable(symbol: &str) -> bool {
    !symbol.is_empty() && symbol.bytes().all(|b| b.is_ascii_graphic() && !b"*?[]\\(){};\"".contains(&b))
}

/// The linker script: one output section, `.text.steady_state`, inserted before `.text`, holding
/// the exact symbols' sections first and then the patterns' (see the module comment). Each rule
/// takes a function's section whether LLVM named it `.text.<symbol>` or, for a `#[cold]` function
/// (such as a vector's growth path, which the steady state still runs now and then),
/// `.text.unlikely.<symbol>`.
pub fn linker_script(symbols: &BTreeSet<String>, recorded_with: &str) -> String {
    let exact: Vec<&String> = symbols.iter().filter(|s| usable(s)).collect();
    // A name without anything build-specific (a C function) is its own pattern: listed once.
    let patterns: BTreeSet<String> =
        symbols.iter().filter_map(|s| stable_pattern(s)).filter(|pattern| !symbols.contains(pattern)).collect();
    let mut script = String::new();
    script.push_str("/* The functions an idle `tenure elect` runs, laid out together (crates/tenure-cli/build.rs).\n");
    script.push_str(" * Generated by `cargo run --release -p tenure-bench --bin steady-state-layout`; do not edit.\n");
    script.push_str(&format!(" * Recorded: {recorded_with}.\n"));
    script.push_str(&format!(" * {} functions; {} patterns for later builds. */\n", exact.len(), patterns.len()));
    script.push_str("SECTIONS\n{\n  .text.steady_state :\n  {\n");
    for name in exact.into_iter().chain(&patterns) {
        script.push_str(&format!("    *(.text.{name} .text.unlikely.{name})\n"));
    }
    script.push_str("  }\n}\nINSERT BEFORE .text;\n");
    script
}

/// What a script written by [`linker_script`] was made from: its "Recorded:" line and its exact
/// symbols. `None` if the text is not such a script.
pub fn parse_script(script: &str) -> Option<(String, BTreeSet<String>)> {
    let recorded_with = script.lines().find_map(|line| line.strip_prefix(" * Recorded: "))?.strip_suffix('.')?;
    let exact = script
        .lines()
        .filter_map(|line| line.strip_prefix("    *(.text.")?.strip_suffix(')')?.split(' ').next())
        .filter(|name| !name.contains('*') && !name.starts_with("0x"))
        .map(str::to_owned)
        .collect();
    Some((recorded_with.to_owned(), exact))
}

#[cfg(test)]
mod tests {
    use super::*;

    const CALLGRIND: &str = "\
# callgrind format
version: 1
ob=(1) /opt/tenure
fl=(1) ???
fn=(1) _ZN6tenure7elector6Driver3run28_$u7b$$u7b$closure$u7d$$u7d$17h591e6e2a5d56f325E
0 10
cob=(2) /usr/lib/x86_64-linux-gnu/libc.so.6
cfn=(2) epoll_wait
calls=1 0
0 5
fn=(3) _RNvNtCsgEmfK2I1SDS_4core3fmt5write'2
0 3
ob=(2)
fn=(2)
0 4
ob=(1)
fn=(1)
0 1
fn=(4) _ZN4core3ptr13drop_in_place17h0123456789abcdefE.llvm.1234
0 1
fn=(5) 0x00000000006ccf55
0 1
";

    #[test]
    fn only_the_functions_of_the_binary_that_ran_are_taken() {
        let run = functions_run(CALLGRIND, "/opt/tenure");
        let expected = [
            "_RNvNtCsgEmfK2I1SDS_4core3fmt5write",
            "_ZN4core3ptr13drop_in_place17h0123456789abcdefE.llvm.1234",
            "_ZN6tenure7elector6Driver3run28_$u7b$$u7b$closure$u7d$$u7d$17h591e6e2a5d56f325E",
        ];
        assert_eq!(
            run.iter().map(String::as_str).collect::<Vec<_>>(),
            expected,
            "no libc function, no callee-only name"
        );
    }

    #[test]
    fn patterns_drop_what_changes_between_builds_and_keep_the_path() {
        assert_eq!(
            stable_pattern("_ZN6tenure4main17hb1fde188ff0eb2d3E").as_deref(),
            Some("_ZN6tenure4main17h*"),
            "legacy hash"
        );
        assert_eq!(
            stable_pattern("_ZN4core3ptr13drop_in_place17h0123456789abcdefE.llvm.1234").as_deref(),
            Some("_ZN4core3ptr13drop_in_place17h*"),
            "legacy hash and an LLVM suffix"
        );
        assert_eq!(
            stable_pattern(
                "_RNvXsZ_NtCslNYArtu3iFV_5alloc6stringNtB5_6StringNtNtCsgEmfK2I1SDS_4core3fmt5Write9write_str.10517"
            )
            .as_deref(),
            Some("_RNvXsZ_NtCs*_5alloc6stringNtB5_6StringNtNtCs*_4core3fmt5Write9write_str*"),
            "v0 crate disambiguators and a numeric suffix"
        );
        assert_eq!(
            stable_pattern("_RNvNtCsgEmfK2I1SDS_4core3fmt5write").as_deref(),
            Some("_RNvNtCs*_4core3fmt5write*"),
            "a later build may give a v0 symbol a suffix"
        );
        assert_eq!(
            stable_pattern(
                "_ZN91_$LT$serde_json..ser..Compound$LT$W$C$F$GT$$u20$as$u20$x$GT$3end17hde19826cfe191beeE.llvm.7"
            )
            .as_deref(),
            Some("_ZN91_$LT$serde_json..ser..Compound$LT$W$C$F$GT$$u20$as$u20$x$GT$3end17h*"),
            "the dots of a legacy path are not a suffix"
        );
        assert_eq!(stable_pattern("memcpy").as_deref(), Some("memcpy"), "a C symbol stays as it is");
        assert_eq!(stable_pattern("a*b"), None, "glob characters would match other sections");
        assert_eq!(stable_pattern("a b"), None);
    }

    #[test]
    fn the_script_lists_exact_sections_before_patterns_in_one_section_before_text() {
        let symbols: BTreeSet<String> = ["_ZN6tenure4main17hb1fde188ff0eb2d3E".to_owned()].into();
        let script = linker_script(&symbols, "test");
        let exact = script
            .find("*(.text._ZN6tenure4main17hb1fde188ff0eb2d3E .text.unlikely._ZN6tenure4main17hb1fde188ff0eb2d3E)")
            .expect("the exact section, also as a cold function");
        let pattern =
            script.find("*(.text._ZN6tenure4main17h* .text.unlikely._ZN6tenure4main17h*)").expect("the pattern");
        assert!(exact < pattern, "{script}");
        assert!(script.contains(".text.steady_state :"), "{script}");
        assert!(script.trim_end().ends_with("INSERT BEFORE .text;"), "{script}");
    }

    /// The script the release build links with is the generator's output for the functions it
    /// lists: hand edits (which a debug build, and so the test suite, would never link) show up.
    #[test]
    fn the_committed_layout_is_exactly_what_the_generator_writes_for_its_functions() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../tenure-cli/steady-state.ld");
        let committed = std::fs::read_to_string(path).expect("crates/tenure-cli/steady-state.ld");
        let (recorded_with, exact) = parse_script(&committed).expect("a generated script");
        assert!(exact.len() > 100, "{} functions: not a recording of the steady state", exact.len());
        assert_eq!(committed, linker_script(&exact, &recorded_with));
    }
}
