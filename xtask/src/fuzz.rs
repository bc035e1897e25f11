//! `cargo xtask fuzz`: run the cargo-fuzz targets of `fuzz/` for a while each and report.
//!
//! 1. installs cargo-fuzz if `cargo fuzz --version` fails (`cargo install cargo-fuzz
//!    --locked`) and checks that rustup has a nightly toolchain (cargo-fuzz needs it);
//! 2. builds every target (`cargo +nightly fuzz build`, AddressSanitizer by default);
//! 3. runs each target (`--target`, repeatable; all by default) for `--seconds`, `--jobs` at
//!    a time, on the committed corpus `fuzz/corpus/<target>/` and the crash inputs
//!    `fuzz/regressions/<target>/`, with the dictionary `fuzz/dicts/<target>.dict` if there is
//!    one, writing what it finds into a scratch corpus `fuzz/work/<target>/` (git-ignored) so
//!    that the committed corpus does not grow;
//! 4. prints a Markdown table from libFuzzer's final statistics, with the path of any crash
//!    input (`fuzz/artifacts/<target>/`), and fails if a target crashed;
//! 5. with `--minimize`, merges the scratch corpus into the committed one and minimizes it
//!    (`cargo fuzz cmin`, one input per covered edge by set cover).
//!
//! docs/fuzzing.md says how a crash becomes a fix and a regression input.

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};

use crate::{exec, vm};

/// Every target in `fuzz/fuzz_targets/`.
pub const TARGETS: [&str; 6] = [
    "wire_decoder",
    "selectors",
    "cgroup_path",
    "request_header",
    "quantity",
    "kubelet_resource",
];

/// `cargo xtask fuzz` flags.
#[derive(Debug, clap::Args)]
pub struct Options {
    /// Only this target (repeatable; default: every target).
    #[arg(long = "target", value_parser = clap::builder::PossibleValuesParser::new(TARGETS))]
    pub targets: Vec<String>,
    /// How long each target runs (libFuzzer's -max_total_time).
    #[arg(long, default_value_t = 600)]
    pub seconds: u64,
    /// Targets run at the same time.
    #[arg(long, default_value_t = 1)]
    pub jobs: usize,
    /// Sanitizer (`cargo fuzz --sanitizer`): address, none, ...
    #[arg(long, default_value = "address")]
    pub sanitizer: String,
    /// Afterwards, merge the scratch corpus into fuzz/corpus/<target> and minimize it
    /// (`cargo fuzz cmin`). With `--seconds 0`, only minimizes.
    #[arg(long)]
    pub minimize: bool,
}

/// What one run left behind.
struct Report {
    target: String,
    seconds: f64,
    executions: Option<u64>,
    exec_per_sec: Option<u64>,
    corpus: Option<u64>,
    coverage: Option<u64>,
    crash: Option<String>,
    failed: bool,
    log: PathBuf,
}

/// A running target.
struct Running {
    target: String,
    child: Child,
    started: Instant,
    log: PathBuf,
}

pub fn run(opts: &Options) -> Result<()> {
    if opts.jobs == 0 {
        bail!("--jobs must be at least 1");
    }
    let root = vm::workspace_root()?;
    let fuzz = root.join("fuzz");
    let targets: Vec<String> = if opts.targets.is_empty() {
        TARGETS.iter().map(|t| (*t).to_owned()).collect()
    } else {
        opts.targets.clone()
    };
    for target in &targets {
        for kind in ["corpus", "regressions"] {
            let dir = fuzz.join(kind).join(target);
            if !dir.is_dir() {
                bail!("{} is missing", dir.display());
            }
        }
    }
    check_nightly()?;
    install_cargo_fuzz()?;
    exec::run(nightly_fuzz(&fuzz).args(["build", "--sanitizer", &opts.sanitizer]))?;

    let mut reports = Vec::new();
    if opts.seconds > 0 {
        let mut queue = targets.iter();
        let mut running: Vec<Running> = Vec::new();
        loop {
            while running.len() < opts.jobs {
                let Some(target) = queue.next() else { break };
                running.push(start(&fuzz, target, opts)?);
            }
            if running.is_empty() {
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
            let mut still = Vec::new();
            for mut r in running {
                match r.child.try_wait()? {
                    Some(status) => {
                        let mut report = parse_log(&r.target, &r.log)?;
                        report.seconds = r.started.elapsed().as_secs_f64();
                        report.failed = !status.success();
                        eprintln!(
                            "fuzz: {} done after {:.0} s ({})",
                            r.target, report.seconds, status
                        );
                        reports.push(report);
                    }
                    None => still.push(r),
                }
            }
            running = still;
        }
        reports.sort_by_key(|r| targets.iter().position(|t| *t == r.target));
        print_table(&reports, &fuzz);
    }

    if opts.minimize {
        for target in &targets {
            minimize(&fuzz, target, opts)?;
        }
    }
    let crashed: Vec<&Report> = reports.iter().filter(|r| r.failed).collect();
    if !crashed.is_empty() {
        for r in &crashed {
            eprintln!(
                "fuzz: {} failed: {} (log: {}); reproduce with `cargo +nightly fuzz run {} {}` \
                 from fuzz/, then see docs/fuzzing.md",
                r.target,
                r.crash.as_deref().unwrap_or("no crash input written"),
                r.log.display(),
                r.target,
                r.crash.as_deref().unwrap_or("<input>"),
            );
        }
        bail!("{} of {} fuzz targets failed", crashed.len(), reports.len());
    }
    Ok(())
}

/// `rustup run nightly cargo fuzz` in `fuzz/`, without the outer (stable) cargo's toolchain
/// settings.
fn nightly_fuzz(fuzz: &Path) -> Command {
    let mut cmd = Command::new("rustup");
    cmd.args(["run", "nightly", "cargo", "fuzz"])
        .current_dir(fuzz)
        .env_remove("RUSTUP_TOOLCHAIN")
        .env_remove("CARGO")
        .env_remove("RUSTC")
        .env_remove("RUSTC_WRAPPER")
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_TARGET_DIR");
    cmd
}

fn check_nightly() -> Result<()> {
    let version =
        exec::output(Command::new("rustup").args(["run", "nightly", "rustc", "--version"]))
            .context(
                "cargo-fuzz needs a nightly toolchain and rustup has none: \
             install it with `rustup toolchain install nightly`",
            )?;
    eprintln!("fuzz: {}", version.trim());
    Ok(())
}

/// Installs cargo-fuzz unless `cargo fuzz --version` works.
fn install_cargo_fuzz() -> Result<()> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let present = Command::new(&cargo)
        .args(["fuzz", "--version"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !present {
        eprintln!("fuzz: installing cargo-fuzz");
        exec::run(Command::new(&cargo).args(["install", "cargo-fuzz", "--locked"]))?;
    }
    Ok(())
}

/// The scratch corpus of `target`, where libFuzzer writes new inputs.
fn work_dir(fuzz: &Path, target: &str) -> PathBuf {
    fuzz.join("work").join(target)
}

fn start(fuzz: &Path, target: &str, opts: &Options) -> Result<Running> {
    let work = work_dir(fuzz, target);
    fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    let corpus = fuzz.join("corpus").join(target);
    let regressions = fuzz.join("regressions").join(target);
    let log = fuzz.join("work").join(format!("{target}.log"));
    let dict = fuzz.join("dicts").join(format!("{target}.dict"));
    let log_file = fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
    let mut cmd = nightly_fuzz(fuzz);
    // The first directory receives new inputs; the committed ones are only read.
    cmd.args(["run", "--sanitizer", &opts.sanitizer, target])
        .arg(&work)
        .arg(&corpus)
        .arg(&regressions)
        .arg("--")
        .arg(format!("-max_total_time={}", opts.seconds))
        .arg("-print_final_stats=1");
    if dict.is_file() {
        cmd.arg(format!("-dict={}", dict.display()));
    }
    cmd.stdout(log_file.try_clone()?).stderr(log_file);
    eprintln!(
        "fuzz: {target} for {} s (log: {})",
        opts.seconds,
        log.display()
    );
    let child = cmd
        .spawn()
        .with_context(|| format!("failed to start {cmd:?}"))?;
    Ok(Running {
        target: target.to_owned(),
        child,
        started: Instant::now(),
        log,
    })
}

/// Reads libFuzzer's output: the `stat::` lines of `-print_final_stats`, the last status line
/// (`#N DONE cov: … corp: …/…b … exec/s: …`), and where a crash input was written.
fn parse_log(target: &str, log: &Path) -> Result<Report> {
    let text = fs::read(log).with_context(|| format!("reading {}", log.display()))?;
    let text = String::from_utf8_lossy(&text);
    let mut report = Report {
        target: target.to_owned(),
        seconds: 0.0,
        executions: None,
        exec_per_sec: None,
        corpus: None,
        coverage: None,
        crash: None,
        failed: false,
        log: log.to_owned(),
    };
    for line in text.lines() {
        let line = line.trim();
        if let Some(v) = stat(line, "stat::number_of_executed_units:") {
            report.executions = Some(v);
        } else if let Some(v) = stat(line, "stat::average_exec_per_sec:") {
            report.exec_per_sec = Some(v);
        } else if line.starts_with('#') && line.contains(" cov: ") {
            report.coverage = field(line, "cov:").or(report.coverage);
            report.corpus = field(line, "corp:").or(report.corpus);
            if report.executions.is_none() {
                report.exec_per_sec = field(line, "exec/s:").or(report.exec_per_sec);
            }
        } else if let Some(path) = line
            .split_once("Test unit written to ")
            .map(|(_, p)| p.trim())
        {
            report.crash = Some(path.to_owned());
        }
    }
    Ok(report)
}

/// `stat::name: 123`.
fn stat(line: &str, name: &str) -> Option<u64> {
    line.strip_prefix(name)?.trim().parse().ok()
}

/// The number after `name` in a status line (`corp: 12/345b` gives 12).
fn field(line: &str, name: &str) -> Option<u64> {
    let (_, rest) = line.split_once(name)?;
    let value: String = rest
        .trim_start()
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    value.parse().ok()
}

fn print_table(reports: &[Report], fuzz: &Path) {
    let show = |v: Option<u64>| v.map_or_else(|| "?".to_owned(), |v| v.to_string());
    println!();
    println!("| target | seconds | executions | exec/s | corpus entries | coverage | crashes |");
    println!("|---|---:|---:|---:|---:|---:|---|");
    for r in reports {
        let crashes = match (&r.crash, r.failed) {
            (Some(path), _) => {
                let path = Path::new(path);
                let shown = path
                    .strip_prefix(fuzz.parent().unwrap_or(fuzz))
                    .unwrap_or(path);
                format!("1 (`{}`)", shown.display())
            }
            (None, true) => format!("1 (no input written; see `{}`)", r.log.display()),
            (None, false) => "0".to_owned(),
        };
        println!(
            "| {} | {:.0} | {} | {} | {} | {} | {} |",
            r.target,
            r.seconds,
            show(r.executions),
            show(r.exec_per_sec),
            show(r.corpus),
            show(r.coverage),
            crashes
        );
    }
    println!();
}

/// Merges the scratch corpus into the committed one and minimizes it with `cargo fuzz cmin`.
fn minimize(fuzz: &Path, target: &str, opts: &Options) -> Result<()> {
    let corpus = fuzz.join("corpus").join(target);
    fs::create_dir_all(&corpus)?;
    let work = work_dir(fuzz, target);
    let mut copied = 0usize;
    if work.is_dir() {
        for entry in fs::read_dir(&work)? {
            let path = entry?.path();
            if let (true, Some(name)) = (path.is_file(), path.file_name()) {
                fs::copy(&path, corpus.join(name))
                    .with_context(|| format!("copying {}", path.display()))?;
                copied += 1;
            }
        }
    }
    let before = fs::read_dir(&corpus)?.count();
    // Keep one input per covered edge (not per hit-count bucket), chosen by set cover: a
    // corpus of hundreds of files rather than thousands, which fuzzing regrows in seconds.
    exec::run(
        nightly_fuzz(fuzz)
            .args(["cmin", "--sanitizer", &opts.sanitizer, target])
            .arg(&corpus)
            .args(["--", "-use_counters=0", "-set_cover_merge=1"]),
    )?;
    let (files, bytes) = fs::read_dir(&corpus)?.try_fold((0usize, 0u64), |(n, b), e| {
        e.map(|e| (n + 1, b + e.metadata().map_or(0, |m| m.len())))
    })?;
    eprintln!(
        "fuzz: {target}: corpus {before} files ({copied} from {}) minimized to {files} files, \
         {bytes} bytes",
        work.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_libfuzzer_final_stats() {
        let dir = std::env::temp_dir().join(format!("kpulse-fuzz-log-{}", std::process::id()));
        fs::create_dir_all(&dir).expect("mkdir");
        let log = dir.join("t.log");
        fs::write(
            &log,
            "INFO: Seed: 1\n\
             #2\tINITED cov: 10 ft: 11 corp: 1/1b exec/s: 0 rss: 30Mb\n\
             #65536\tpulse  cov: 120 ft: 300 corp: 40/900b lim: 100 exec/s: 32768 rss: 40Mb\n\
             #100000\tDONE   cov: 123 ft: 321 corp: 42/1024b lim: 100 exec/s: 33333 rss: 41Mb\n\
             Done 100000 runs in 3 second(s)\n\
             stat::number_of_executed_units: 100000\n\
             stat::average_exec_per_sec:     33333\n\
             stat::new_units_added:          41\n",
        )
        .expect("write");
        let r = parse_log("t", &log).expect("parse");
        assert_eq!(r.executions, Some(100_000));
        assert_eq!(r.exec_per_sec, Some(33_333));
        assert_eq!(r.coverage, Some(123));
        assert_eq!(r.corpus, Some(42));
        assert_eq!(r.crash, None);

        fs::write(
            &log,
            "#1000\tNEW    cov: 50 ft: 60 corp: 9/99b exec/s: 0 rss: 30Mb\n\
             thread '<unnamed>' panicked at src/lib.rs:1:1:\n\
             ==1== ERROR: libFuzzer: deadly signal\n\
             artifact_prefix='/x/fuzz/artifacts/t/'; Test unit written to /x/fuzz/artifacts/t/crash-abc\n\
             stat::number_of_executed_units: 1001\n",
        )
        .expect("write");
        let r = parse_log("t", &log).expect("parse");
        assert_eq!(r.crash.as_deref(), Some("/x/fuzz/artifacts/t/crash-abc"));
        assert_eq!(r.executions, Some(1001));
        assert_eq!(r.corpus, Some(9));
        fs::remove_dir_all(&dir).expect("cleanup");
    }
}
