//! arm64 from this amd64 host: Debian's arm64 packages, and Rust built for
//! `aarch64-unknown-linux-gnu`.
//!
//! - **Packages** ([`Apt`]): apt with a configuration of its own under
//!   `target/cross/apt-arm64/` (its own sources, lists, cache, `APT::Architecture "arm64"`;
//!   the host's `apt.conf.d`, so its proxy and retry settings hold) downloads arm64 packages
//!   (the VM's kernel, busybox) for `dpkg-deb -x`. The host's dpkg
//!   never learns of arm64 (no `dpkg --add-architecture`) and the host's apt lock is not taken.
//! - **Rust** ([`build`]): rustup's toolchains have no aarch64 standard library and cannot
//!   download one, so the build uses the eBPF build's Debian rustc 1.96 pair with its library
//!   source and `-Z build-std`, linked by Debian's `aarch64-linux-gnu-gcc`, statically
//!   (`+crt-static`: the executables need nothing from a guest but its kernel). It runs with
//!   a cleared environment and an explicit `PATH`, keeping only what reaching crates.io
//!   needs ([`KEPT_ENV`]: proxies, CA files, cargo's network and registry settings, `TMPDIR`):
//!   rustup's variables (`RUSTUP_TOOLCHAIN`, `CARGO`, `RUSTC`) would otherwise send part of
//!   it back to rustup's toolchain. Its own target directory, `target/aarch64/`.
//!
//! docs/design/toolchain.md says how this was found and what each piece costs.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context, Result};

use crate::exec;

/// The Rust target of arm64 Linux.
pub const TARGET: &str = "aarch64-unknown-linux-gnu";
/// Debian's cross C compiler (package `gcc-aarch64-linux-gnu`): the linker, and the C
/// compiler of crates with C code.
pub const GCC: &str = "aarch64-linux-gnu-gcc";
const AR: &str = "aarch64-linux-gnu-ar";
/// The static C library of Debian's `libc6-dev-arm64-cross` (only recommended by the
/// compiler's package): what `+crt-static` links.
pub const LIBC: &str = "/usr/aarch64-linux-gnu/lib/libc.a";
/// The crates built optimised in the dev profile: Arm emulated on x86-64 runs about 30
/// times slower than this host, and a debug agent took 22 s there to load its eBPF object
/// (0.8 s here), longer than the tests' liveness bounds. These are what loading spends its
/// time in (the kernel's BTF, the object, their hash maps); optimising every crate cut the
/// arm64 suite from 122 s to 75 s but cost 17.5 CPU-minutes of build instead of 6.
const OPTIMISED: [&str; 8] = [
    "std",
    "core",
    "alloc",
    "hashbrown",
    "aya",
    "aya-obj",
    "btf-rs",
    "object",
];
/// Debian's rustc pair (see `build_ebpf`): the only toolchain here with library source.
const CARGO: &str = "/usr/bin/cargo";
const RUSTC: &str = "/usr/bin/rustc";

/// apt for this host's architecture, or for arm64 with a private configuration.
pub struct Apt {
    /// `APT_CONFIG` of the private configuration; `None` for the host's own apt.
    config: Option<PathBuf>,
}

impl Apt {
    /// The host's apt.
    pub fn host() -> Apt {
        Apt { config: None }
    }

    /// apt for arm64 packages, configured under `<root>/target/cross/apt-arm64/` (written
    /// every time: it is a few lines) with the host's Debian release's suites.
    pub fn arm64(root: &Path) -> Result<Apt> {
        let dir = root.join("target/cross/apt-arm64");
        let codename = host_codename()?;
        for sub in [
            "lists/partial",
            "archives/partial",
            "etc/preferences.d",
            "etc/sources.list.d",
        ] {
            let d = dir.join(sub);
            fs::create_dir_all(&d).with_context(|| format!("cannot create {}", d.display()))?;
        }
        let status = dir.join("status");
        if !status.exists() {
            fs::write(&status, "").with_context(|| format!("cannot write {}", status.display()))?;
        }
        let keyring = "/usr/share/keyrings/debian-archive-keyring.gpg";
        let sources = format!(
            "deb [arch=arm64 signed-by={keyring}] http://deb.debian.org/debian {codename} main\n\
             deb [arch=arm64 signed-by={keyring}] http://deb.debian.org/debian {codename}-updates main\n\
             deb [arch=arm64 signed-by={keyring}] http://deb.debian.org/debian-security {codename}-security main\n"
        );
        let d = dir.display();
        let config = format!(
            "APT::Architecture \"arm64\";\n\
             APT::Architectures {{ \"arm64\"; }};\n\
             Dir::State \"{d}\";\n\
             Dir::State::Lists \"{d}/lists\";\n\
             Dir::State::status \"{d}/status\";\n\
             Dir::Cache \"{d}\";\n\
             Dir::Cache::Archives \"{d}/archives\";\n\
             Dir::Etc::SourceList \"{d}/etc/sources.list\";\n\
             Dir::Etc::SourceParts \"{d}/etc/sources.list.d\";\n\
             Dir::Etc::Parts \"/etc/apt/apt.conf.d\";\n\
             Dir::Etc::Preferences \"{d}/etc/preferences\";\n\
             Dir::Etc::PreferencesParts \"{d}/etc/preferences.d\";\n"
        );
        for (name, text) in [("etc/sources.list", sources), ("apt.conf", config)] {
            let path = dir.join(name);
            fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
        }
        let apt = Apt {
            config: Some(dir.join("apt.conf")),
        };
        let lists = fs::read_dir(dir.join("lists"))
            .map(|entries| entries.flatten().any(|e| e.file_name() != "partial"))
            .unwrap_or(false);
        if !lists {
            apt.update()?;
        }
        Ok(apt)
    }

    /// `program` (apt-get, apt-cache) with this apt's configuration.
    fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(program);
        if let Some(config) = &self.config {
            cmd.env("APT_CONFIG", config);
        }
        cmd
    }

    /// Whether `update` may run: the host's apt only as root, the private one always.
    pub fn can_update(&self) -> Result<bool> {
        Ok(self.config.is_some() || crate::vm::is_root()?)
    }

    /// `apt-get update`.
    pub fn update(&self) -> Result<()> {
        exec::run(self.command("apt-get").args(["update", "-q"])).context("apt-get update failed")
    }

    /// `apt-get download <package>` into `dir`.
    pub fn download(&self, package: &str, dir: &Path) -> Result<()> {
        eprintln!("apt-get download {package}{}", self.label());
        exec::output(
            self.command("apt-get")
                .args(["download", package])
                .current_dir(dir),
        )
        .map(|_| ())
    }

    /// `apt-get download`, once more after an `apt-get update` if the first try fails (the
    /// archive moves on; lists go stale).
    pub fn download_updating(&self, package: &str, dir: &Path) -> Result<()> {
        match self.download(package, dir) {
            Ok(()) => Ok(()),
            Err(e) if self.can_update()? => {
                eprintln!("{e:#}\nupdating the package lists and trying again");
                self.update()?;
                self.download(package, dir)
            }
            Err(e) => Err(e),
        }
    }

    /// `apt-cache search --names-only <pattern>`.
    pub fn search(&self, pattern: &str) -> Result<String> {
        exec::output(
            self.command("apt-cache")
                .args(["search", "--names-only", pattern]),
        )
    }

    fn label(&self) -> &'static str {
        if self.config.is_some() {
            " (arm64)"
        } else {
            ""
        }
    }
}

/// `VERSION_CODENAME` of `/etc/os-release` (bookworm on this kind of machine).
fn host_codename() -> Result<String> {
    let text = fs::read_to_string("/etc/os-release").context("cannot read /etc/os-release")?;
    codename(&text).context("/etc/os-release has no VERSION_CODENAME: not Debian?")
}

fn codename(os_release: &str) -> Option<String> {
    os_release
        .lines()
        .find_map(|l| l.strip_prefix("VERSION_CODENAME="))
        .map(|v| v.trim().trim_matches('"').to_owned())
        .filter(|v| !v.is_empty())
}

/// A package's file `path` for arm64, downloaded and unpacked once under
/// `<root>/target/cross/<package>/`.
pub fn arm64_file(root: &Path, package: &str, path: &str) -> Result<PathBuf> {
    let dir = root.join("target/cross").join(package);
    let file = dir.join(path.trim_start_matches('/'));
    if file.is_file() {
        return Ok(file);
    }
    let apt = Apt::arm64(root)?;
    let scratch = root
        .join("target/cross")
        .join(format!("download-{package}-{}", std::process::id()));
    let unpack = scratch.join("unpacked");
    fs::create_dir_all(&unpack).with_context(|| format!("cannot create {}", unpack.display()))?;
    let result = (|| {
        apt.download_updating(package, &scratch)?;
        let deb = fs::read_dir(&scratch)
            .with_context(|| format!("cannot read {}", scratch.display()))?
            .flatten()
            .map(|e| e.path())
            .find(|p| p.extension().is_some_and(|x| x == "deb"))
            .with_context(|| format!("apt-get download {package} left no .deb"))?;
        exec::run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&unpack))?;
        if dir.exists() {
            fs::remove_dir_all(&dir).with_context(|| format!("cannot remove {}", dir.display()))?;
        }
        fs::rename(&unpack, &dir)
            .with_context(|| format!("cannot rename {} to {}", unpack.display(), dir.display()))
    })();
    let _ = fs::remove_dir_all(&scratch);
    result?;
    if !file.is_file() {
        bail!("the arm64 package {package} has no {path}");
    }
    Ok(file)
}

/// What [`build`] made: each named test's executable and the package's binaries.
#[derive(Debug, Default)]
pub struct Built {
    /// `(test name, executable)`.
    pub tests: Vec<(String, PathBuf)>,
    /// `(binary name, executable)`.
    pub bins: Vec<(String, PathBuf)>,
}

/// Builds `package`'s integration `tests` (and with them its binaries) for arm64, statically
/// linked, in the dev profile with [`OPTIMISED`] crates optimised, and says where they are.
pub fn build(root: &Path, package: &str, tests: &[&str]) -> Result<Built> {
    let mut cmd = cross_cargo(root, "test");
    cmd.args(["--no-run", "--message-format=json", "-p", package]);
    for t in tests {
        cmd.args(["--test", t]);
    }
    eprintln!(
        "cross: building {package}'s tests {} for {TARGET}",
        tests.join(", ")
    );
    let out = exec::output(&mut cmd)?;
    let built = artifacts(&out);
    for t in tests {
        if !built.tests.iter().any(|(n, _)| n == t) {
            bail!("cargo reported no {TARGET} executable for test {t} of {package}");
        }
    }
    Ok(built)
}

/// The test and binary executables in cargo's `--message-format=json` output.
fn artifacts(json_lines: &str) -> Built {
    let mut built = Built::default();
    for line in json_lines.lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if v["reason"] != "compiler-artifact" {
            continue;
        }
        let (Some(name), Some(exe)) = (v["target"]["name"].as_str(), v["executable"].as_str())
        else {
            continue;
        };
        let kinds = v["target"]["kind"].as_array().cloned().unwrap_or_default();
        let entry = (name.to_owned(), PathBuf::from(exe));
        if kinds.iter().any(|k| k == "test") {
            built.tests.push(entry);
        } else if kinds.iter().any(|k| k == "bin") {
            built.bins.push(entry);
        }
    }
    built
}

/// Variables the cross build keeps from this environment (`*` ends a prefix): the network
/// (`-Z build-std` fetches std's dependencies from crates.io), nothing of any toolchain.
const KEPT_ENV: [&str; 12] = [
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "TMPDIR",
    "CARGO_HTTP_*",
    "CARGO_NET_*",
    "CARGO_REGISTRIES_*",
];

/// Whether the cross build keeps the variable `name` (see [`KEPT_ENV`]).
fn kept(name: &str) -> bool {
    KEPT_ENV.iter().any(|k| match k.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => name == *k,
    })
}

/// Debian's cargo `subcommand` for [`TARGET`], in a cleared environment (see the module
/// docs).
fn cross_cargo(root: &Path, subcommand: &str) -> Command {
    let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
    let cargo_home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(&home).join(".cargo"));
    let target_env = TARGET.to_uppercase().replace('-', "_");
    let cc_env = TARGET.replace('-', "_");
    let mut cmd = Command::new(CARGO);
    cmd.env_clear()
        .envs(std::env::vars_os().filter(|(k, _)| k.to_str().is_some_and(kept)))
        .current_dir(root)
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", &home)
        .env("CARGO_HOME", cargo_home)
        .env("RUSTC", RUSTC)
        // -Z build-std on a stable rustc.
        .env("RUSTC_BOOTSTRAP", "1")
        .env("CARGO_INCREMENTAL", "0")
        .env("CARGO_TERM_COLOR", "never")
        .env(format!("CARGO_TARGET_{target_env}_LINKER"), GCC)
        .env(
            format!("CARGO_TARGET_{target_env}_RUSTFLAGS"),
            "-C target-feature=+crt-static",
        )
        .env(format!("CC_{cc_env}"), GCC)
        .env(format!("AR_{cc_env}"), AR)
        .env("CARGO_TARGET_DIR", root.join("target/aarch64"))
        .args(OPTIMISED.iter().flat_map(|package| {
            [
                "--config".to_owned(),
                format!("profile.dev.package.{package}.opt-level=2"),
            ]
        }))
        .args([subcommand, "-Z", "build-std", "--target", TARGET]);
    cmd
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_codename_comes_from_os_release() {
        let text = "PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nVERSION_CODENAME=bookworm\n";
        assert_eq!(codename(text).as_deref(), Some("bookworm"));
        assert_eq!(
            codename("VERSION_CODENAME=\"trixie\"\n").as_deref(),
            Some("trixie")
        );
        assert_eq!(codename("ID=debian\n"), None);
        assert_eq!(codename("VERSION_CODENAME=\n"), None);
    }

    #[test]
    fn the_build_keeps_the_network_and_no_toolchain() {
        for name in [
            "https_proxy",
            "NO_PROXY",
            "SSL_CERT_FILE",
            "CARGO_HTTP_TIMEOUT",
        ] {
            assert!(kept(name), "{name}");
        }
        for name in [
            "RUSTUP_TOOLCHAIN",
            "CARGO",
            "RUSTC",
            "RUSTFLAGS",
            "CARGO_BUILD_TARGET",
        ] {
            assert!(!kept(name), "{name}");
        }
    }

    #[test]
    fn tests_and_binaries_are_told_apart() {
        let out = r#"{"reason":"compiler-artifact","target":{"name":"kpulse-agent","kind":["bin"]},"executable":"/t/kpulse-agent"}
{"reason":"compiler-artifact","target":{"name":"accuracy","kind":["test"]},"executable":"/t/deps/accuracy-1"}
{"reason":"compiler-artifact","target":{"name":"kpulse_agent","kind":["lib"]},"executable":null}
{"reason":"build-finished","success":true}
not json"#;
        let built = artifacts(out);
        assert_eq!(
            built.tests,
            [("accuracy".to_owned(), PathBuf::from("/t/deps/accuracy-1"))]
        );
        assert_eq!(
            built.bins,
            [("kpulse-agent".to_owned(), PathBuf::from("/t/kpulse-agent"))]
        );
    }
}
