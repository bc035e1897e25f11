//! Command-line flags (clap derive, each with an environment variable), validated before
//! anything is loaded or bound.

use std::{path::PathBuf, time::Duration};

use clap::{Args, Parser, Subcommand};

use crate::collect::Mode;

/// Shortest accepted `--resolution`.
pub const MIN_RESOLUTION: Duration = Duration::from_millis(100);

/// Largest accepted `--max-cgroups` (about 200 MB of record map).
pub const MAX_CGROUPS_LIMIT: usize = 1_000_000;

/// kpulse node agent.
#[derive(Debug, Parser)]
#[command(name = "kpulse-agent", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print one JSON object per cgroup (and one for the node) per tick.
    Dump(DumpArgs),
}

/// Flags shared by everything that collects.
#[derive(Debug, Clone, Args)]
pub struct CollectArgs {
    /// Interval between collections (e.g. `1s`, `250ms`); at least 100ms.
    #[arg(long, env = "KPULSE_RESOLUTION", default_value = "1s", value_parser = parse_duration)]
    pub resolution: Duration,
    /// Which collector: eBPF with cgroupfs fallback, eBPF only, or cgroupfs only.
    #[arg(long, env = "KPULSE_COLLECTOR", value_enum, default_value = "auto")]
    pub collector: Mode,
    /// Subtree to report, relative to the cgroup mount (e.g. `/kubepods.slice`).
    #[arg(long, env = "KPULSE_CGROUP_ROOT", default_value = "/")]
    pub cgroup_root: String,
    /// Load the eBPF object from this file instead of the embedded one.
    #[arg(long, env = "KPULSE_EBPF_OBJECT")]
    pub ebpf_object: Option<PathBuf>,
    /// Upper bound on cgroups reported per tick (sizes the eBPF record map: 200 bytes each).
    #[arg(long, env = "KPULSE_MAX_CGROUPS", default_value_t = 16_384)]
    pub max_cgroups: usize,
}

/// `dump` flags.
#[derive(Debug, Clone, Args)]
pub struct DumpArgs {
    /// Number of ticks to print, then exit (0 = until interrupted).
    #[arg(long, default_value_t = 1)]
    pub count: u64,
    /// Collection flags.
    #[command(flatten)]
    pub collect: CollectArgs,
}

/// A flag combination that cannot work.
#[derive(Debug, thiserror::Error)]
#[error("invalid flags: {}", .0.join("; "))]
pub struct ConfigError(pub Vec<String>);

impl CollectArgs {
    /// Checks every flag, reporting all problems at once.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut errs = Vec::new();
        if self.resolution < MIN_RESOLUTION {
            errs.push(format!(
                "--resolution {} is below the minimum of 100ms",
                humantime::format_duration(self.resolution)
            ));
        }
        if self.max_cgroups == 0 || self.max_cgroups > MAX_CGROUPS_LIMIT {
            errs.push(format!(
                "--max-cgroups must be between 1 and {MAX_CGROUPS_LIMIT}"
            ));
        }
        if self.cgroup_root.split('/').any(|p| p == "..") {
            errs.push(format!(
                "--cgroup-root {:?} must not contain `..`",
                self.cgroup_root
            ));
        }
        if errs.is_empty() {
            Ok(())
        } else {
            Err(ConfigError(errs))
        }
    }
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{s:?}: {e} (use e.g. 1s, 500ms)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("kpulse-agent").chain(args.iter().copied()))
    }

    #[test]
    fn defaults() {
        let cli = parse(&["dump"]).expect("parse");
        let Command::Dump(d) = cli.command;
        assert_eq!(d.count, 1);
        assert_eq!(d.collect.resolution, Duration::from_secs(1));
        assert_eq!(d.collect.collector, Mode::Auto);
        assert_eq!(d.collect.cgroup_root, "/");
        d.collect.validate().expect("valid");
    }

    #[test]
    fn resolution_bounds() {
        let cli = parse(&["dump", "--resolution", "100ms"]).expect("parse");
        let Command::Dump(d) = cli.command;
        d.collect.validate().expect("100ms is allowed");
        let cli = parse(&["dump", "--resolution", "99ms", "--max-cgroups", "0"]).expect("parse");
        let Command::Dump(d) = cli.command;
        let err = d.collect.validate().expect_err("too fast");
        assert!(err.to_string().contains("below the minimum"), "{err}");
        assert!(err.to_string().contains("--max-cgroups"), "{err}");
        assert!(parse(&["dump", "--resolution", "fast"]).is_err());
    }

    #[test]
    fn collector_values() {
        for (v, m) in [
            ("auto", Mode::Auto),
            ("ebpf", Mode::Ebpf),
            ("cgroupfs", Mode::Cgroupfs),
        ] {
            let cli = parse(&["dump", "--collector", v]).expect("parse");
            let Command::Dump(d) = cli.command;
            assert_eq!(d.collect.collector, m);
        }
        assert!(parse(&["dump", "--collector", "procfs"]).is_err());
    }

    #[test]
    fn dotdot_root_is_refused() {
        let cli = parse(&["dump", "--cgroup-root", "/a/../b"]).expect("parse");
        let Command::Dump(d) = cli.command;
        assert!(d.collect.validate().is_err());
    }
}
