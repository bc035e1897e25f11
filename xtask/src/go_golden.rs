//! `cargo xtask go-golden [--check]`: what Go itself answers for the edge cases that
//! `aggregator-api/src/go.rs` reproduces.
//!
//! Runs the Go program of `aggregator-api/testdata/go-edge/` (`go run .`, with the go.mod
//! and go.sum checked in beside it: apimachinery v0.33.2, as metrics-server v0.8.0) and
//! writes what it prints to `golden.jsonl` there; the aggregator-api unit test
//! `go::tests::matches_output_captured_from_go` checks kpulse against every line. With
//! `--check` nothing is written: it fails, naming the lines, when the checked-in file is not
//! what Go prints now (a hand edit, or a Go or apimachinery change). The lints stage of
//! `cargo xtask test` runs the check.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::cluster::gobuild;

/// `cargo xtask go-golden` flags.
#[derive(Debug, clap::Args)]
pub struct Options {
    /// Compare golden.jsonl with what Go prints instead of rewriting it.
    #[arg(long)]
    pub check: bool,
}

/// The Go program's directory.
fn program_dir(root: &Path) -> PathBuf {
    root.join("aggregator-api/testdata/go-edge")
}

/// Runs `go run .` in the program's directory and returns what it printed.
fn go_output(dir: &Path) -> Result<String> {
    let go = gobuild::go_command()?;
    let mut cmd = gobuild::go(&go, dir);
    // go.mod and go.sum are checked in: the run must not change them.
    cmd.env("GOFLAGS", "-mod=readonly -buildvcs=false")
        .args(["run", "."]);
    crate::exec::output(&mut cmd)
}

/// The lines that differ, as `golden.jsonl:N` with both versions; empty when equal.
fn differences(checked_in: &str, from_go: &str) -> Vec<String> {
    let (old, new): (Vec<&str>, Vec<&str>) =
        (checked_in.lines().collect(), from_go.lines().collect());
    let mut out = Vec::new();
    for i in 0..old.len().max(new.len()) {
        let (a, b) = (old.get(i), new.get(i));
        if a != b {
            out.push(format!(
                "golden.jsonl:{}:\n  checked in: {}\n  Go prints:  {}",
                i + 1,
                a.copied().unwrap_or("(no line)"),
                b.copied().unwrap_or("(no line)")
            ));
        }
    }
    if out.is_empty() && checked_in != from_go {
        out.push("golden.jsonl: line endings or the final newline differ".to_owned());
    }
    out
}

/// Runs the command.
pub fn run(opts: &Options) -> Result<()> {
    let root = crate::vm::workspace_root()?;
    let dir = program_dir(&root);
    let golden = dir.join("golden.jsonl");
    let from_go = go_output(&dir)?;
    if !opts.check {
        std::fs::write(&golden, &from_go)
            .with_context(|| format!("writing {}", golden.display()))?;
        println!(
            "go-golden: wrote {} lines to {}",
            from_go.lines().count(),
            golden.display()
        );
        return Ok(());
    }
    let checked_in = std::fs::read_to_string(&golden)
        .with_context(|| format!("reading {}", golden.display()))?;
    let diffs = differences(&checked_in, &from_go);
    if !diffs.is_empty() {
        bail!(
            "{} is not what Go prints ({} lines differ; `cargo xtask go-golden` rewrites it, \
             then check kpulse with `cargo test -p kpulse-aggregator-api --lib go::`):\n{}",
            golden.display(),
            diffs.len(),
            diffs.join("\n")
        );
    }
    println!(
        "go-golden: {} matches what Go prints ({} lines)",
        golden.display(),
        from_go.lines().count()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_files_have_no_differences() {
        assert!(differences("a\nb\n", "a\nb\n").is_empty());
    }

    #[test]
    fn differing_lines_are_named() {
        let d = differences("a\nb\nc\n", "a\nB\nc\nd\n");
        assert_eq!(d.len(), 2, "{d:?}");
        assert!(d[0].starts_with("golden.jsonl:2:"), "{d:?}");
        assert!(
            d[0].contains("checked in: b") && d[0].contains("Go prints:  B"),
            "{d:?}"
        );
        assert!(d[1].contains("(no line)"), "{d:?}");
    }

    #[test]
    fn a_missing_final_newline_is_a_difference() {
        assert_eq!(differences("a", "a\n").len(), 1);
    }
}
