//! `cargo xtask build-ebpf`: check the eBPF toolchain (installing missing pieces when that is
//! safe), then build `ebpf/` for `bpfel-unknown-none` and copy the object to
//! `target/ebpf/kpulse.bpf.o`.
//!
//! The toolchain is not rustup's: rustup's toolchains here have no `rust-src`, so the build uses
//! Debian's rustc 1.96 pair (`rustc-web`, `cargo-web`) with its library source (`rust-web-src`)
//! and `-Z build-std=core`, linked by `bpf-linker` 0.13.0 built against the same LLVM major (22)
//! as that rustc. See docs/design/toolchain.md.
//!
//! Nothing is replaced: a piece that is missing is installed (apt needs root on Debian/Ubuntu;
//! `bpf-linker` goes to `~/.cargo/bin`), a piece with the wrong version is an error that says how
//! to fix it. When everything is in place the check only runs a few `--version`s (about 1 s).
//!
//! [`clippy`] lints `ebpf/` the same way, with Debian's clippy of the same rustc
//! (`rust-web-clippy`), which it checks and installs like the other pieces.
//!
//! Testing only: `KPULSE_RUSTC`, `KPULSE_CARGO`, `KPULSE_RUST_SRC_LOCK`, `KPULSE_LLVM_CONFIG`,
//! `KPULSE_BPF_LINKER` and `KPULSE_CARGO_CLIPPY` override where each piece is looked for; an
//! overridden piece that is missing is reported, never installed.

use std::{
    env,
    ffi::{OsStr, OsString},
    fmt::Write as _,
    fs,
    io::Write as _,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{bail, ensure, Context, Result};

use crate::exec;

/// Options of `cargo xtask build-ebpf`.
#[derive(Debug, clap::Args)]
pub struct Options {
    /// Build with the release profile (the object the agent ships).
    #[arg(long)]
    pub release: bool,
    /// Only check the toolchain: never run apt-get or cargo install, fail naming what is missing.
    #[arg(long)]
    pub no_install: bool,
    /// Lint `ebpf/` with Debian's clippy as `cargo xtask test` does, instead of building.
    #[arg(long, conflicts_with_all = ["release", "no_install"])]
    pub clippy: bool,
}

/// Upstream Rust release of Debian's rustc pair and of its library source (`major.minor.`).
const RUST_RELEASE: &str = "1.96.";
/// LLVM major shared by Debian's rustc and bpf-linker.
const LLVM_MAJOR: u32 = 22;
const BPF_LINKER_VERSION: &str = "0.13.0";
const TARGET: &str = "bpfel-unknown-none";
/// Name of the eBPF crate's `[[bin]]`, i.e. of the artifact cargo writes.
const ARTIFACT: &str = "kpulse";
/// Where the object goes, relative to the workspace root.
const OBJECT: &str = "target/ebpf/kpulse.bpf.o";
/// Rust flags of the eBPF build; without `--btf` the object has no `.BTF` section.
const RUSTFLAGS: [&str; 3] = [
    r#"--cfg=bpf_target_arch="x86_64""#,
    "-Cdebuginfo=2",
    "-Clink-arg=--btf",
];

const DEFAULT_RUSTC: &str = "/usr/bin/rustc";
const DEFAULT_CARGO: &str = "/usr/bin/cargo";
const DEFAULT_RUST_SRC_LOCK: &str = "/usr/lib/rustlib/src/rust/library/Cargo.lock";
const DEFAULT_LLVM_CONFIG: &str = "/usr/lib/llvm-22/bin/llvm-config";
/// Debian's `cargo clippy` front end; it runs the `clippy-driver` beside it. Run directly:
/// `/usr/bin/cargo clippy` would pick rustup's `~/.cargo/bin/cargo-clippy` first (cargo searches
/// `$CARGO_HOME/bin` before PATH for subcommands), i.e. another release's clippy.
const DEFAULT_CARGO_CLIPPY: &str = "/usr/bin/cargo-clippy";

/// Environment variables that point a piece elsewhere (testing only).
const ENV_RUSTC: &str = "KPULSE_RUSTC";
const ENV_CARGO: &str = "KPULSE_CARGO";
const ENV_RUST_SRC_LOCK: &str = "KPULSE_RUST_SRC_LOCK";
const ENV_LLVM_CONFIG: &str = "KPULSE_LLVM_CONFIG";
const ENV_BPF_LINKER: &str = "KPULSE_BPF_LINKER";
const ENV_CARGO_CLIPPY: &str = "KPULSE_CARGO_CLIPPY";

/// Variables of the outer `cargo run`/rustup that would redirect or confuse the inner build.
const DROP_FROM_CHILD_ENV: &[&str] = &[
    "RUSTUP_TOOLCHAIN",
    "RUSTUP_TOOLCHAIN_SOURCE",
    "RUST_RECURSION_COUNT",
    "RUSTC",
    "RUSTDOC",
    "RUSTFLAGS",
    "RUSTDOCFLAGS",
    "RUSTC_WRAPPER",
    "RUSTC_WORKSPACE_WRAPPER",
    "RUSTC_BOOTSTRAP",
];
/// `CARGO_*` variables that are user configuration (home, install root, registries, network,
/// terminal) and stay; every other `CARGO_*` (`CARGO`, `CARGO_MANIFEST_DIR`, `CARGO_PKG_*`, `CARGO_TARGET_DIR`,
/// `CARGO_BUILD_*`, `CARGO_ENCODED_RUSTFLAGS`, `CARGO_PROFILE_*` ...) is dropped.
const KEEP_CARGO_ENV: &[&str] = &[
    "CARGO_HOME",
    "CARGO_INSTALL_ROOT",
    "CARGO_REGISTRIES_",
    "CARGO_REGISTRY_",
    "CARGO_NET_",
    "CARGO_TERM_",
    "CARGO_HTTP_",
];

/// Checks (and installs what is missing of) the eBPF toolchain, builds `ebpf/` and returns the
/// path of `target/ebpf/kpulse.bpf.o`.
pub fn run(opts: &Options) -> Result<PathBuf> {
    let root = workspace_root();
    let tools = Tools::from_lookup(|name| env::var_os(name));
    let linker = ensure_toolchain(&tools, &root, &Piece::BUILD, opts.no_install)?;
    build(&root, &tools, &linker, opts.release)
}

/// Lints `ebpf/` with Debian's clippy of the same rustc: `cargo clippy -Z build-std=core
/// --target bpfel-unknown-none --release -- -D warnings`, in the build's environment. Checks
/// (and installs what is missing of) the toolchain first, `rust-web-clippy` included.
pub fn clippy() -> Result<()> {
    let root = workspace_root();
    let tools = Tools::from_lookup(|name| env::var_os(name));
    let linker = ensure_toolchain(&tools, &root, &Piece::LINT, false)?;
    let mut cmd = ebpf_command(&root, &tools, &linker, &tools.cargo_clippy)?;
    // cargo-clippy runs `$CARGO check` with itself as the workspace wrapper: point it at
    // Debian's cargo (the scrubbed environment has no CARGO).
    cmd.env("CARGO", &tools.cargo)
        .args([
            "clippy",
            "-Z",
            "build-std=core",
            "--target",
            TARGET,
            "--release",
        ])
        .arg("--target-dir")
        .arg(root.join("target"))
        .args(["--", "-D", "warnings"]);
    println!(
        "linting ebpf/ with {} (about 20 s the first time, 1 s after)",
        tools.cargo_clippy.display()
    );
    let started = Instant::now();
    exec::run(&mut cmd).context("clippy found problems in ebpf/ (or could not run)")?;
    println!(
        "ebpf/ is clippy-clean ({:.1} s)",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Checks `pieces`, installs what is missing when that is allowed, and returns the path of
/// the bpf-linker that passed its check.
fn ensure_toolchain(
    tools: &Tools,
    root: &Path,
    pieces: &[Piece],
    no_install: bool,
) -> Result<PathBuf> {
    let started = Instant::now();
    let mut found = check_all(tools, pieces);
    if !found.all_ok() {
        let host = Host::detect(no_install, tools)?;
        match decide(&found.checks, &host, tools) {
            Plan::Fail(message) => bail!(message),
            Plan::Install { apt, bpf_linker } => {
                install(&apt, bpf_linker, tools, root)?;
                found = check_all(tools, pieces);
                if !found.all_ok() {
                    bail!(
                        "the eBPF toolchain is still not right after installing:\n{}",
                        describe_problems(&found.checks, &host, tools)
                    );
                }
            }
        }
    }
    println!(
        "eBPF toolchain ready ({:.1} s)",
        started.elapsed().as_secs_f64()
    );
    found
        .bpf_linker
        .context("bpf-linker passed its check but its path was not recorded")
}

fn workspace_root() -> PathBuf {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest_dir
        .parent()
        .map_or_else(|| manifest_dir.join(".."), Path::to_path_buf)
}

// ---------------------------------------------------------------------------------------------
// Toolchain pieces

/// One separately checked and separately installed part of the toolchain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Piece {
    /// `/usr/bin/rustc` and `/usr/bin/cargo`, Debian's 1.96 with LLVM 22.
    Rust,
    /// The library source `-Z build-std` compiles.
    RustSrc,
    /// LLVM 22 development files bpf-linker builds against.
    Llvm,
    /// bpf-linker 0.13.0 linked to LLVM 22.
    BpfLinker,
    /// Debian's clippy (`cargo-clippy`, `clippy-driver`) of the same rustc; only for linting.
    Clippy,
}

impl Piece {
    const ALL: [Piece; 5] = [
        Piece::Rust,
        Piece::RustSrc,
        Piece::Llvm,
        Piece::BpfLinker,
        Piece::Clippy,
    ];
    /// What `build-ebpf` needs.
    const BUILD: [Piece; 4] = [Piece::Rust, Piece::RustSrc, Piece::Llvm, Piece::BpfLinker];
    /// What [`clippy`] needs: the build's pieces and clippy.
    const LINT: [Piece; 5] = Piece::ALL;

    fn describe(self, tools: &Tools) -> String {
        match self {
            Piece::Rust => format!(
                "Debian's rustc {RUST_RELEASE}x pair ({}, {})",
                tools.rustc.display(),
                tools.cargo.display()
            ),
            Piece::RustSrc => format!(
                "Rust library source for -Z build-std ({})",
                tools.rust_src_lock.display()
            ),
            Piece::Llvm => format!(
                "LLVM {LLVM_MAJOR} for bpf-linker ({})",
                tools.llvm_config.display()
            ),
            Piece::BpfLinker => {
                format!("bpf-linker {BPF_LINKER_VERSION} built against LLVM {LLVM_MAJOR}")
            }
            Piece::Clippy => format!(
                "Debian's clippy {RUST_RELEASE}x ({}, {})",
                tools.cargo_clippy.display(),
                tools.clippy_driver().display()
            ),
        }
    }

    /// `(apt package, pinned upstream version prefix)` that provide this piece.
    fn apt_packages(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Piece::Rust => &[("rustc-web", RUST_RELEASE), ("cargo-web", RUST_RELEASE)],
            Piece::RustSrc => &[("rust-web-src", RUST_RELEASE)],
            Piece::Llvm => &[("llvm-22-dev", "22.")],
            Piece::BpfLinker => &[],
            Piece::Clippy => &[("rust-web-clippy", RUST_RELEASE)],
        }
    }

    /// Measured install time (2 cores, warm mirrors; bpf-linker took 46-66 s on an idle machine,
    /// 188 s on a busy one), for the progress line.
    fn install_secs(self) -> u32 {
        match self {
            Piece::Rust => 9,
            Piece::RustSrc => 7,
            Piece::Llvm => 19,
            Piece::BpfLinker => 60,
            Piece::Clippy => 3,
        }
    }

    fn override_vars(self) -> &'static [&'static str] {
        match self {
            Piece::Rust => &[ENV_RUSTC, ENV_CARGO],
            Piece::RustSrc => &[ENV_RUST_SRC_LOCK],
            Piece::Llvm => &[ENV_LLVM_CONFIG],
            Piece::BpfLinker => &[ENV_BPF_LINKER],
            Piece::Clippy => &[ENV_CARGO_CLIPPY],
        }
    }
}

/// Where each piece is looked for.
#[derive(Debug)]
struct Tools {
    rustc: PathBuf,
    cargo: PathBuf,
    rust_src_lock: PathBuf,
    llvm_config: PathBuf,
    /// `KPULSE_BPF_LINKER`; otherwise bpf-linker is searched on PATH and in cargo's bin dir.
    bpf_linker: Option<PathBuf>,
    cargo_clippy: PathBuf,
    /// Pieces with at least one overridden path: never installed.
    overridden: Vec<Piece>,
}

impl Tools {
    fn from_lookup(lookup: impl Fn(&str) -> Option<OsString>) -> Self {
        let get = |var: &str, default: &str| {
            lookup(var)
                .filter(|v| !v.is_empty())
                .map_or_else(|| PathBuf::from(default), PathBuf::from)
        };
        let overridden = Piece::ALL
            .into_iter()
            .filter(|p| {
                p.override_vars()
                    .iter()
                    .any(|v| lookup(v).is_some_and(|v| !v.is_empty()))
            })
            .collect();
        Tools {
            rustc: get(ENV_RUSTC, DEFAULT_RUSTC),
            cargo: get(ENV_CARGO, DEFAULT_CARGO),
            rust_src_lock: get(ENV_RUST_SRC_LOCK, DEFAULT_RUST_SRC_LOCK),
            llvm_config: get(ENV_LLVM_CONFIG, DEFAULT_LLVM_CONFIG),
            bpf_linker: lookup(ENV_BPF_LINKER)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from),
            cargo_clippy: get(ENV_CARGO_CLIPPY, DEFAULT_CARGO_CLIPPY),
            overridden,
        }
    }

    /// The `clippy-driver` that `cargo-clippy` runs: the one in its own directory.
    fn clippy_driver(&self) -> PathBuf {
        self.cargo_clippy.with_file_name("clippy-driver")
    }

    /// `/usr/lib/llvm-22`: the prefix bpf-linker's build script must see (`<prefix>/bin/llvm-config`).
    fn llvm_prefix(&self) -> PathBuf {
        self.llvm_config
            .parent()
            .filter(|bin| bin.file_name() == Some(OsStr::new("bin")))
            .and_then(Path::parent)
            .map_or_else(|| PathBuf::from("/usr/lib/llvm-22"), Path::to_path_buf)
    }
}

// ---------------------------------------------------------------------------------------------
// Checking

/// What one check found.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Status {
    /// Present and the right version; says what was found.
    Ok(String),
    /// Not there: installing it fixes that.
    Missing(String),
    /// There, but not what the build needs: we do not replace it ourselves.
    Wrong(String),
}

#[derive(Debug)]
struct Found {
    checks: Vec<(Piece, Status)>,
    /// The bpf-linker that passed its check.
    bpf_linker: Option<PathBuf>,
}

impl Found {
    fn all_ok(&self) -> bool {
        self.checks
            .iter()
            .all(|(_, status)| matches!(status, Status::Ok(_)))
    }
}

fn check_all(tools: &Tools, pieces: &[Piece]) -> Found {
    let mut checks = Vec::new();
    let mut bpf_linker = None;
    for &piece in pieces {
        print!("checking {} ... ", piece.describe(tools));
        // Progress only: a failed flush just delays the line.
        let _ = std::io::stdout().flush();
        let status = match piece {
            Piece::Rust => check_rust(tools),
            Piece::RustSrc => check_rust_src(tools),
            Piece::Llvm => check_llvm(tools),
            Piece::BpfLinker => {
                let (status, path) = check_bpf_linker(tools);
                bpf_linker = path;
                status
            }
            Piece::Clippy => check_clippy(tools),
        };
        match &status {
            Status::Ok(what) => println!("ok: {what}"),
            Status::Missing(what) => println!("MISSING: {what}"),
            Status::Wrong(what) => println!("WRONG: {what}"),
        }
        checks.push((piece, status));
    }
    Found { checks, bpf_linker }
}

/// `Missing`, naming each of `paths` that does not exist; `None` if all do.
fn missing(paths: &[&Path]) -> Option<Status> {
    let missing: Vec<String> = paths
        .iter()
        .filter(|p| !p.exists())
        .map(|p| format!("{} does not exist", p.display()))
        .collect();
    (!missing.is_empty()).then(|| Status::Missing(missing.join(", ")))
}

/// What `tool arg` prints, or `Wrong` with why it could not run.
fn version_output(tool: &Path, arg: &str) -> Result<String, Status> {
    exec::output(Command::new(tool).arg(arg)).map_err(|e| Status::Wrong(format!("{e:#}")))
}

fn check_rust(tools: &Tools) -> Status {
    if let Some(m) = missing(&[&tools.rustc, &tools.cargo]) {
        return m;
    }
    let rustc = match version_output(&tools.rustc, "-vV") {
        Ok(out) => out,
        Err(wrong) => return wrong,
    };
    let RustcVersion { release, llvm } = match parse_rustc_vv(&rustc) {
        Ok(v) => v,
        Err(e) => return Status::Wrong(format!("{} -vV: {e:#}", tools.rustc.display())),
    };
    if !release.starts_with(RUST_RELEASE) || llvm_major(&llvm) != Some(LLVM_MAJOR) {
        return Status::Wrong(format!(
            "{} is release {release} with LLVM {llvm}; the build needs {RUST_RELEASE}x with \
             LLVM {LLVM_MAJOR} (the version of the library source, the LLVM of bpf-linker)",
            tools.rustc.display()
        ));
    }
    let cargo = match version_output(&tools.cargo, "-V") {
        Ok(out) => out,
        Err(wrong) => return wrong,
    };
    match parse_tool_version(&cargo, "cargo") {
        Some(v) if v.starts_with(RUST_RELEASE) => {
            Status::Ok(format!("rustc {release}, cargo {v}, LLVM {llvm}"))
        }
        other => Status::Wrong(format!(
            "{} is {}; the build needs {RUST_RELEASE}x like {}",
            tools.cargo.display(),
            other.unwrap_or("of an unknown version"),
            tools.rustc.display()
        )),
    }
}

fn check_rust_src(tools: &Tools) -> Status {
    if !tools.rust_src_lock.is_file() {
        return Status::Missing(format!("{} does not exist", tools.rust_src_lock.display()));
    }
    // /usr/lib/rustlib/src/rust -> /usr/src/rustc-1.96.0: the directory names the release.
    let src = tools
        .rust_src_lock
        .parent()
        .and_then(Path::parent)
        .and_then(|p| fs::canonicalize(p).ok());
    match src.as_deref().and_then(rust_src_release) {
        Some(release) if !release.starts_with(RUST_RELEASE) => Status::Wrong(format!(
            "the library source is {release} ({}); the build needs {RUST_RELEASE}x",
            src.as_deref().unwrap_or(Path::new("?")).display()
        )),
        Some(release) => Status::Ok(format!("source of {release}")),
        None => Status::Ok("present (release not named by its directory)".to_owned()),
    }
}

fn check_llvm(tools: &Tools) -> Status {
    if let Some(m) = missing(&[&tools.llvm_config]) {
        return m;
    }
    match exec::output(Command::new(&tools.llvm_config).arg("--version")) {
        Ok(out) => {
            let version = out.trim();
            if llvm_major(version) == Some(LLVM_MAJOR) {
                Status::Ok(format!("LLVM {version}"))
            } else {
                Status::Wrong(format!(
                    "{} reports LLVM {version}, not {LLVM_MAJOR}",
                    tools.llvm_config.display()
                ))
            }
        }
        Err(e) => Status::Wrong(format!("{e:#}")),
    }
}

/// `cargo-clippy` and its `clippy-driver` must be the very rustc that builds `core` for the
/// lint (`/usr/bin/rustc`): a driver of another build cannot read that `core`'s metadata.
fn check_clippy(tools: &Tools) -> Status {
    let driver = tools.clippy_driver();
    if let Some(m) = missing(&[&tools.cargo_clippy, &driver]) {
        return m;
    }
    let front = match version_output(&tools.cargo_clippy, "--version") {
        Ok(out) => out,
        Err(wrong) => return wrong,
    };
    let front = parse_tool_version(&front, "clippy").unwrap_or("of an unknown version");
    if clippy_release(front).is_none_or(|release| !release.starts_with(RUST_RELEASE)) {
        return Status::Wrong(format!(
            "{} is clippy {front}; the build needs clippy 0.{RUST_RELEASE}x (rustc {RUST_RELEASE}x)",
            tools.cargo_clippy.display()
        ));
    }
    let driver_vv = match version_output(&driver, "-vV") {
        Ok(out) => out,
        Err(wrong) => return wrong,
    };
    let rustc_vv = match exec::output(Command::new(&tools.rustc).arg("-vV")) {
        Ok(out) => out,
        Err(e) => {
            return Status::Wrong(format!(
                "cannot compare with {}: {e:#}",
                tools.rustc.display()
            ))
        }
    };
    let driver_commit = vv_field(&driver_vv, "commit-hash:");
    let rustc_commit = vv_field(&rustc_vv, "commit-hash:");
    let driver_release = vv_field(&driver_vv, "release:").unwrap_or_else(|| "?".to_owned());
    if driver_commit.is_none() || driver_commit != rustc_commit {
        return Status::Wrong(format!(
            "{} is rustc {driver_release} (commit {}), {} is commit {}: clippy must come \
             from the same rustc build",
            driver.display(),
            driver_commit.as_deref().unwrap_or("?"),
            tools.rustc.display(),
            rustc_commit.as_deref().unwrap_or("?")
        ));
    }
    Status::Ok(format!("clippy {front}, driver of rustc {driver_release}"))
}

/// `"0.1.96"` (clippy's version) -> `"1.96."`, comparable with [`RUST_RELEASE`].
fn clippy_release(version: &str) -> Option<String> {
    let mut parts = version.strip_prefix("0.")?.split('.');
    let (major, minor) = (parts.next()?, parts.next()?);
    (major.parse::<u32>().is_ok() && minor.parse::<u32>().is_ok())
        .then(|| format!("{major}.{minor}."))
}

fn check_bpf_linker(tools: &Tools) -> (Status, Option<PathBuf>) {
    let path = match &tools.bpf_linker {
        Some(path) if is_executable(path) => path.clone(),
        Some(path) => {
            return (
                Status::Missing(format!(
                    "{} ({ENV_BPF_LINKER}) is not an executable",
                    path.display()
                )),
                None,
            )
        }
        None => match find_bpf_linker() {
            Some(path) => path,
            None => {
                return (
                    Status::Missing(format!(
                        "not found on PATH or in {}",
                        cargo_bin_dir().display()
                    )),
                    None,
                )
            }
        },
    };
    let version = match version_output(&path, "--version") {
        Ok(out) => out,
        Err(wrong) => return (wrong, None),
    };
    let version = parse_tool_version(&version, "bpf-linker").unwrap_or("of an unknown version");
    if version != BPF_LINKER_VERSION {
        return (
            Status::Wrong(format!(
                "{} is {version}, the build needs {BPF_LINKER_VERSION}",
                path.display()
            )),
            None,
        );
    }
    // A dynamically linked bpf-linker names its libLLVM; a static one cannot be checked this way.
    let linked = exec::output(Command::new("ldd").arg(&path))
        .ok()
        .and_then(|out| ldd_llvm_major(&out));
    let status = match linked {
        Some(major) if major == LLVM_MAJOR => Status::Ok(format!(
            "{version} at {}, linked to libLLVM {major}",
            path.display()
        )),
        Some(major) => {
            return (
                Status::Wrong(format!(
                    "{} is linked to libLLVM {major}; Debian's rustc {RUST_RELEASE}x emits \
                     LLVM {LLVM_MAJOR} bitcode",
                    path.display()
                )),
                None,
            )
        }
        None => Status::Ok(format!(
            "{version} at {} (warning: no libLLVM in `ldd`, its LLVM major is unchecked)",
            path.display()
        )),
    };
    (status, Some(path))
}

fn find_bpf_linker() -> Option<PathBuf> {
    let on_path = env::var_os("PATH")
        .and_then(|path| env::split_paths(&path).find_map(|dir| executable_in(&dir)));
    on_path
        .or_else(|| {
            env::var_os("CARGO_INSTALL_ROOT")
                .and_then(|root| executable_in(&Path::new(&root).join("bin")))
        })
        .or_else(|| executable_in(&cargo_bin_dir()))
}

fn executable_in(dir: &Path) -> Option<PathBuf> {
    let candidate = dir.join("bpf-linker");
    is_executable(&candidate).then_some(candidate)
}

fn is_executable(path: &Path) -> bool {
    fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Where `cargo install` puts binaries: `$CARGO_HOME/bin`, by default `~/.cargo/bin`.
fn cargo_bin_dir() -> PathBuf {
    env::var_os("CARGO_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| env::var_os("HOME").map(|home| Path::new(&home).join(".cargo")))
        .unwrap_or_else(|| PathBuf::from("/root/.cargo"))
        .join("bin")
}

#[derive(Debug, PartialEq, Eq)]
struct RustcVersion {
    release: String,
    llvm: String,
}

/// Reads `release:` and `LLVM version:` from `rustc -vV`.
fn parse_rustc_vv(text: &str) -> Result<RustcVersion> {
    let field = |name: &str| vv_field(text, name).with_context(|| format!("no `{name}` line"));
    Ok(RustcVersion {
        release: field("release:")?,
        llvm: field("LLVM version:")?,
    })
}

/// The value of the line `name` (e.g. `"release:"`) of `rustc -vV` output.
fn vv_field(text: &str, name: &str) -> Option<String> {
    text.lines()
        .find_map(|line| line.strip_prefix(name))
        .map(|v| v.trim().to_owned())
}

/// `"cargo 1.96.0 (30a34c682 2026-05-25)"` -> `"1.96.0"`; `None` unless it names `tool`.
fn parse_tool_version<'a>(text: &'a str, tool: &str) -> Option<&'a str> {
    let mut words = text.split_whitespace();
    (words.next()? == tool).then(|| words.next()).flatten()
}

/// `"22.1.8"` -> 22.
fn llvm_major(version: &str) -> Option<u32> {
    version.split('.').next()?.trim().parse().ok()
}

/// LLVM major of the `libLLVM` in `ldd` output: `libLLVM.so.22.1` or `libLLVM-22.so`.
fn ldd_llvm_major(ldd: &str) -> Option<u32> {
    ldd.split_whitespace()
        .filter_map(|word| word.rsplit('/').next()?.strip_prefix("libLLVM"))
        .find_map(|rest| {
            let digits = rest.trim_start_matches(['.', '-', 's', 'o']);
            let end = digits
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(digits.len());
            digits[..end].parse().ok()
        })
}

/// `/usr/src/rustc-1.96.0` -> `"1.96.0"`.
fn rust_src_release(dir: &Path) -> Option<String> {
    let name = dir.file_name()?.to_str()?;
    let release = name.strip_prefix("rustc-")?;
    release
        .starts_with(|c: char| c.is_ascii_digit())
        .then(|| release.to_owned())
}

// ---------------------------------------------------------------------------------------------
// Deciding what to install

/// Whether installing is possible here, found only when something is missing.
#[derive(Debug)]
struct Host {
    root: bool,
    /// `Err(reason)` when apt cannot be used (and for what reason).
    apt: Result<(), String>,
    no_install: bool,
}

impl Host {
    fn detect(no_install: bool, tools: &Tools) -> Result<Self> {
        let uid = exec::output(Command::new("id").arg("-u"))?;
        let root = uid.trim() == "0";
        let debian = Path::new("/etc/debian_version").exists();
        let has_apt = env::var_os("PATH").is_some_and(|path| {
            env::split_paths(&path).any(|dir| is_executable(&dir.join("apt-get")))
        });
        let apt = if !debian || !has_apt {
            Err(format!(
                "this is not Debian/Ubuntu (no /etc/debian_version or no apt-get): the pieces \
                 are Debian 12 packages (bookworm-security); provide the same files and versions \
                 at {}, {}, {}, {}",
                tools.rustc.display(),
                tools.cargo.display(),
                tools.rust_src_lock.display(),
                tools.llvm_config.display()
            ))
        } else if !root {
            Err("apt-get needs root: run the commands above with sudo, or rerun as root".to_owned())
        } else {
            Ok(())
        };
        Ok(Host {
            root,
            apt,
            no_install,
        })
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Plan {
    /// Install these (apt first: bpf-linker builds against llvm-22-dev).
    Install { apt: Vec<Piece>, bpf_linker: bool },
    /// Stop with this message.
    Fail(String),
}

fn decide(checks: &[(Piece, Status)], host: &Host, tools: &Tools) -> Plan {
    let missing: Vec<Piece> = checks
        .iter()
        .filter(|(_, s)| matches!(s, Status::Missing(_)))
        .map(|(p, _)| *p)
        .collect();
    let mut blockers = Vec::new();
    if checks.iter().any(|(_, s)| matches!(s, Status::Wrong(_))) {
        blockers.push(
            "a piece has the wrong version, and xtask does not replace installed versions"
                .to_owned(),
        );
    }
    if host.no_install && !missing.is_empty() {
        blockers.push("--no-install was given".to_owned());
    }
    for piece in missing.iter().filter(|p| tools.overridden.contains(p)) {
        blockers.push(format!(
            "{} overrides where {} is looked for (testing only)",
            piece.override_vars().join("/"),
            piece.describe(tools)
        ));
    }
    if missing.iter().any(|p| !p.apt_packages().is_empty()) {
        if let Err(reason) = &host.apt {
            blockers.push(reason.clone());
        }
    }
    if !blockers.is_empty() {
        let mut message = format!(
            "the eBPF toolchain is not ready:\n{}",
            describe_problems(checks, host, tools)
        );
        for blocker in blockers {
            let _ = write!(message, "\nnot installing: {blocker}");
        }
        return Plan::Fail(message);
    }
    Plan::Install {
        apt: missing
            .iter()
            .copied()
            .filter(|p| !p.apt_packages().is_empty())
            .collect(),
        bpf_linker: missing.contains(&Piece::BpfLinker),
    }
}

/// One entry per piece that is not ok: what is wrong and the command that fixes it.
fn describe_problems(checks: &[(Piece, Status)], host: &Host, tools: &Tools) -> String {
    let mut out = String::new();
    for (piece, status) in checks {
        let (what, replace) = match status {
            Status::Ok(_) => continue,
            Status::Missing(what) => (what, false),
            Status::Wrong(what) => (what, true),
        };
        let llvm_ok = checks
            .iter()
            .any(|(p, s)| *p == Piece::Llvm && matches!(s, Status::Ok(_)));
        let fix = if *piece == Piece::BpfLinker && llvm_ok {
            bpf_linker_install_command(tools, replace)
        } else if *piece == Piece::BpfLinker {
            format!(
                "(once LLVM {LLVM_MAJOR} is fixed) {}",
                bpf_linker_install_command(tools, replace)
            )
        } else {
            apt_install_command(&[*piece], !host.root, replace)
        };
        let _ = write!(
            out,
            "  - {}: {what}\n    fix: {fix}\n",
            piece.describe(tools)
        );
    }
    out.trim_end().to_owned()
}

/// The apt command that installs `pieces`, versions pinned with apt's `pkg=1.96*` globs.
fn apt_install_command(pieces: &[Piece], sudo: bool, replace: bool) -> String {
    let sudo = if sudo { "sudo " } else { "" };
    let packages: Vec<String> = pieces
        .iter()
        .flat_map(|p| p.apt_packages())
        .map(|(pkg, upstream)| {
            if pkg.contains(upstream.trim_end_matches('.')) {
                (*pkg).to_owned()
            } else {
                format!("'{pkg}={upstream}*'")
            }
        })
        .collect();
    format!(
        "{sudo}apt-get update && {sudo}env DEBIAN_FRONTEND=noninteractive apt-get install -y \
         --no-install-recommends{} {}",
        if replace { " --allow-downgrades" } else { "" },
        packages.join(" ")
    )
}

fn bpf_linker_install_command(tools: &Tools, replace: bool) -> String {
    let bin = tools.llvm_prefix().join("bin");
    format!(
        "PATH={}:$PATH LLVM_PREFIX={} cargo install bpf-linker --version {BPF_LINKER_VERSION} \
         --locked --no-default-features --features llvm-{LLVM_MAJOR}{}",
        bin.display(),
        tools.llvm_prefix().display(),
        if replace { " --force" } else { "" }
    )
}

// ---------------------------------------------------------------------------------------------
// Installing

fn install(apt: &[Piece], bpf_linker: bool, tools: &Tools, root: &Path) -> Result<()> {
    if !apt.is_empty() {
        apt_install(apt)?;
    }
    if bpf_linker {
        let prefix = tools.llvm_prefix();
        println!(
            "installing bpf-linker {BPF_LINKER_VERSION} (LLVM {LLVM_MAJOR}) with cargo install \
             (about {} s, more on a busy machine)",
            Piece::BpfLinker.install_secs()
        );
        let path = prepend_path(&prefix.join("bin"), &child_search_path("PATH", root));
        let mut cmd = Command::new("cargo");
        scrub_child_env(&mut cmd, root);
        cmd.current_dir(root)
            .env("PATH", path)
            .env("LLVM_PREFIX", &prefix)
            .args(["install", "bpf-linker", "--version", BPF_LINKER_VERSION])
            .args(["--locked", "--no-default-features", "--features"])
            .arg(format!("llvm-{LLVM_MAJOR}"));
        exec::run(&mut cmd).context("installing bpf-linker failed")?;
    }
    Ok(())
}

fn apt_install(pieces: &[Piece]) -> Result<()> {
    println!("updating apt's package lists (about 5 s)");
    exec::run(apt_command().args(["update", "-q"])).context("apt-get update failed")?;

    let mut pinned = Vec::new();
    for (pkg, upstream) in pieces.iter().flat_map(|p| p.apt_packages()) {
        let madison = exec::output(Command::new("apt-cache").args(["madison", pkg]))?;
        let policy = exec::output(Command::new("apt-cache").args(["policy", pkg]))?;
        let (version, note) = pick_apt_version(pkg, upstream, &madison, &policy)?;
        if let Some(note) = note {
            println!("note: {note}");
        }
        pinned.push(format!("{pkg}={version}"));
    }
    let secs: u32 = pieces.iter().map(|p| p.install_secs()).sum();
    println!(
        "installing {} with apt-get (about {secs} s)",
        pinned.join(" ")
    );
    exec::run(
        apt_command()
            .args(["install", "-y", "-q", "--no-install-recommends"])
            .args(&pinned),
    )
    .context("apt-get install failed")
}

fn apt_command() -> Command {
    let mut cmd = Command::new("apt-get");
    cmd.env("DEBIAN_FRONTEND", "noninteractive");
    cmd
}

/// Picks the newest version of `pkg` whose upstream version starts with `upstream` from
/// `apt-cache madison`, with a note when apt's candidate (`apt-cache policy`) is another one.
fn pick_apt_version(
    pkg: &str,
    upstream: &str,
    madison: &str,
    policy: &str,
) -> Result<(String, Option<String>)> {
    // madison lists binary versions newest first: ` pkg | version | source Packages`.
    let offered: Vec<&str> = madison
        .lines()
        .filter_map(|line| {
            let mut cols = line.split('|').map(str::trim);
            let (name, version, source) = (cols.next()?, cols.next()?, cols.next()?);
            (name == pkg && !source.ends_with("Sources")).then_some(version)
        })
        .collect();
    let Some(chosen) = offered
        .iter()
        .find(|v| upstream_version(v).starts_with(upstream))
    else {
        bail!(
            "apt offers {pkg} in {}, but the eBPF build needs {upstream}x (rustc and bpf-linker \
             must share LLVM {LLVM_MAJOR}; see docs/design/toolchain.md)",
            if offered.is_empty() {
                "no version".to_owned()
            } else {
                offered.join(", ")
            }
        );
    };
    let candidate = policy
        .lines()
        .find_map(|line| line.trim().strip_prefix("Candidate:"))
        .map(str::trim)
        .filter(|c| *c != "(none)");
    let note = candidate
        .filter(|c| !upstream_version(c).starts_with(upstream))
        .map(|c| format!("apt's candidate for {pkg} is {c}; installing the pinned {chosen}"));
    Ok(((*chosen).to_owned(), note))
}

/// Debian version without epoch and revision: `"1:22.1.8-1~deb12u1"` -> `"22.1.8"`.
fn upstream_version(version: &str) -> &str {
    let no_epoch = version.split_once(':').map_or(version, |(_, rest)| rest);
    no_epoch.rsplit_once('-').map_or(no_epoch, |(up, _)| up)
}

// ---------------------------------------------------------------------------------------------
// Building

/// `program` (Debian's cargo, or cargo-clippy) run in `ebpf/` with the inner build's
/// environment: the outer cargo's and rustup's variables removed, Debian's rustc, nightly
/// features allowed, the eBPF rust flags, bpf-linker first on PATH.
fn ebpf_command(root: &Path, tools: &Tools, linker: &Path, program: &Path) -> Result<Command> {
    let linker_dir = linker
        .parent()
        .context("bpf-linker's path has no directory")?;
    let mut cmd = Command::new(program);
    scrub_child_env(&mut cmd, root);
    cmd.current_dir(root.join("ebpf"))
        .env("RUSTC", &tools.rustc)
        .env("RUSTC_BOOTSTRAP", "1")
        .env("CARGO_ENCODED_RUSTFLAGS", encoded_rustflags())
        .env(
            "PATH",
            prepend_path(linker_dir, &child_search_path("PATH", root)),
        );
    Ok(cmd)
}

fn build(root: &Path, tools: &Tools, linker: &Path, release: bool) -> Result<PathBuf> {
    let profile = if release { "release" } else { "debug" };
    let target_dir = root.join("target");

    let mut cmd = ebpf_command(root, tools, linker, &tools.cargo)?;
    cmd.args(["build", "-Z", "build-std=core", "--target", TARGET])
        .arg("--target-dir")
        .arg(&target_dir);
    if release {
        cmd.arg("--release");
    } else {
        // An unoptimised eBPF program (and an unoptimised `core` under it) does not pass
        // the verifier ("last insn is not an exit or jmp"): the debug build keeps debug
        // info but optimises every crate of this inner build, `core` included.
        cmd.env("CARGO_PROFILE_DEV_OPT_LEVEL", "3")
            .env("CARGO_PROFILE_DEV_DEBUG_ASSERTIONS", "false")
            .env("CARGO_PROFILE_DEV_OVERFLOW_CHECKS", "false")
            .env("CARGO_INCREMENTAL", "0");
    }
    println!(
        "building ebpf/ ({profile}) with {} (about 40 s the first time, 1 s after)",
        tools.cargo.display()
    );
    let started = Instant::now();
    exec::run(&mut cmd).context("building the eBPF programs failed")?;
    println!("built in {:.1} s", started.elapsed().as_secs_f64());

    let artifact = target_dir.join(TARGET).join(profile).join(ARTIFACT);
    let bytes = fs::read(&artifact).with_context(|| format!("reading {}", artifact.display()))?;
    let sections =
        elf_section_names(&bytes).with_context(|| format!("checking {}", artifact.display()))?;
    ensure!(
        sections.iter().any(|s| s == ".BTF"),
        "{} has no .BTF section (sections: {}); was it linked without -Clink-arg=--btf?",
        artifact.display(),
        sections.join(" ")
    );

    let object = root.join(OBJECT);
    let dir = object.parent().context("object path has no directory")?;
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    // The agent's build script watches the object (and its directory): an unchanged object
    // is left as it is, so that a second `build-ebpf` (the cluster build runs one beside the
    // host tests) does not make Cargo rebuild the agent.
    let unchanged = fs::read(&object).is_ok_and(|old| old == bytes);
    if !unchanged {
        // Write beside it and rename, so a concurrent agent build never embeds half an object.
        let partial = object.with_extension("o.partial");
        fs::write(&partial, &bytes).with_context(|| format!("writing {}", partial.display()))?;
        fs::rename(&partial, &object)
            .with_context(|| format!("renaming {} to {}", partial.display(), object.display()))?;
    }
    println!(
        "{} {OBJECT}: {} bytes ({:.1} KiB), {} sections, with .BTF{}",
        if unchanged {
            "kept (unchanged)"
        } else {
            "wrote"
        },
        bytes.len(),
        bytes.len() as f64 / 1024.0,
        sections.len(),
        if sections.iter().any(|s| s == ".BTF.ext") {
            " and .BTF.ext"
        } else {
            ""
        }
    );
    Ok(object)
}

/// `CARGO_ENCODED_RUSTFLAGS`: the flags separated by 0x1f, so none of them is split on spaces.
fn encoded_rustflags() -> String {
    RUSTFLAGS.join("\x1f")
}

/// Removes what the outer `cargo run` and rustup set (see [`drop_from_child_env`]) and cleans
/// `LD_LIBRARY_PATH` of the outer toolchain's and target's directories.
fn scrub_child_env(cmd: &mut Command, root: &Path) {
    for (name, _) in env::vars_os() {
        if name.to_str().is_some_and(drop_from_child_env) {
            cmd.env_remove(&name);
        }
    }
    match env::var_os("LD_LIBRARY_PATH").map(|_| child_search_path("LD_LIBRARY_PATH", root)) {
        Some(cleaned) if cleaned.is_empty() => {
            cmd.env_remove("LD_LIBRARY_PATH");
        }
        Some(cleaned) => {
            cmd.env("LD_LIBRARY_PATH", cleaned);
        }
        None => {}
    }
}

/// Whether the inner build must not inherit the variable `name`.
fn drop_from_child_env(name: &str) -> bool {
    if DROP_FROM_CHILD_ENV.contains(&name) {
        return true;
    }
    name.starts_with("CARGO")
        && !KEEP_CARGO_ENV
            .iter()
            .any(|keep| name == *keep || (keep.ends_with('_') && name.starts_with(keep)))
}

/// The variable `var` (a `:` list) without entries under rustup's toolchains or our target dir,
/// which `cargo run` adds for the host toolchain.
fn child_search_path(var: &str, root: &Path) -> OsString {
    let rustup_home = env::var_os("RUSTUP_HOME")
        .map(PathBuf::from)
        .or_else(|| env::var_os("HOME").map(|home| Path::new(&home).join(".rustup")));
    let mut drop = vec![root.join("target")];
    drop.extend(rustup_home.map(|home| home.join("toolchains")));
    clean_search_path(&env::var_os(var).unwrap_or_default(), &drop)
}

fn clean_search_path(value: &OsStr, drop_under: &[PathBuf]) -> OsString {
    let kept: Vec<PathBuf> = env::split_paths(value)
        .filter(|dir| !dir.as_os_str().is_empty() && !drop_under.iter().any(|d| dir.starts_with(d)))
        .collect();
    // Entries come from split_paths, so they contain no ':' and joining cannot fail.
    env::join_paths(kept).unwrap_or_default()
}

fn prepend_path(dir: &Path, rest: &OsStr) -> OsString {
    let mut path = OsString::from(dir);
    if !rest.is_empty() {
        path.push(":");
        path.push(rest);
    }
    path
}

/// Names of the sections of a little-endian ELF64 BPF object.
fn elf_section_names(data: &[u8]) -> Result<Vec<String>> {
    const EM_BPF: u16 = 247;
    ensure!(
        data.len() >= 64 && data[..4] == *b"\x7fELF",
        "not an ELF file"
    );
    ensure!(
        data[4] == 2 && data[5] == 1,
        "not a little-endian ELF64 file (class {}, data {})",
        data[4],
        data[5]
    );
    let u16_at = |at: usize| -> Result<u16> {
        let b = data.get(at..at + 2).context("ELF file is truncated")?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    };
    let u32_at = |at: usize| -> Result<u32> {
        let b = data.get(at..at + 4).context("ELF file is truncated")?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let u64_at = |at: usize| -> Result<usize> {
        let b = data.get(at..at + 8).context("ELF file is truncated")?;
        let mut word = [0; 8];
        word.copy_from_slice(b);
        usize::try_from(u64::from_le_bytes(word)).context("ELF offset does not fit in memory")
    };
    let machine = u16_at(0x12)?;
    ensure!(machine == EM_BPF, "not a BPF object (e_machine {machine})");
    let shoff = u64_at(0x28)?;
    let shentsize = usize::from(u16_at(0x3a)?);
    let shnum = usize::from(u16_at(0x3c)?);
    let shstrndx = usize::from(u16_at(0x3e)?);
    ensure!(
        shnum > 0 && shentsize >= 64,
        "ELF file has no usable section headers"
    );
    ensure!(
        shstrndx < shnum,
        "ELF section name index {shstrndx} is out of range"
    );
    ensure!(
        shnum
            .checked_mul(shentsize)
            .and_then(|size| size.checked_add(shoff))
            .is_some_and(|end| end <= data.len()),
        "ELF section headers are out of bounds (truncated file?)"
    );
    let header = |index: usize| {
        index
            .checked_mul(shentsize)
            .and_then(|off| off.checked_add(shoff))
            .context("ELF section header offset overflows")
    };
    let strtab_header = header(shstrndx)?;
    let strtab_off = u64_at(strtab_header + 0x18)?;
    let strtab_size = u64_at(strtab_header + 0x20)?;
    let strtab = strtab_off
        .checked_add(strtab_size)
        .and_then(|end| data.get(strtab_off..end))
        .context("ELF section name table is out of bounds")?;
    (0..shnum)
        .map(|index| {
            let name_off = usize::try_from(u32_at(header(index)?)?)
                .context("ELF section name offset does not fit")?;
            let name = strtab
                .get(name_off..)
                .context("ELF section name is out of bounds")?;
            let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
            Ok(String::from_utf8_lossy(&name[..end]).into_owned())
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests panic, not anyhow
mod tests {
    use super::*;

    /// The Containerfile builds the eBPF object inside the image with this module's toolchain
    /// and flags: the same Debian packages, bpf-linker, target and rust flags.
    #[test]
    fn the_containerfile_builds_the_object_as_build_ebpf_does() {
        let root = workspace_root();
        let containerfile = fs::read_to_string(root.join("Containerfile")).expect("Containerfile");
        let script = fs::read_to_string(root.join("images/build.sh")).expect("images/build.sh");
        for piece in Piece::BUILD {
            for (pkg, upstream) in piece.apt_packages() {
                let epoch = if *pkg == "llvm-22-dev" { "1:" } else { "" };
                let pinned = format!("'{pkg}={epoch}{upstream}*'");
                assert!(
                    containerfile.contains(&pinned),
                    "Containerfile lacks {pinned}"
                );
            }
        }
        assert!(containerfile.contains(&format!(
            "cargo install --locked bpf-linker --version {BPF_LINKER_VERSION} \
             --no-default-features --features llvm-{LLVM_MAJOR}"
        )));
        assert!(containerfile.contains(&format!("LLVM_PREFIX=/usr/lib/llvm-{LLVM_MAJOR}")));
        // The script's flags, with its `\037` separators as the build's `\x1f`.
        let flags = script
            .lines()
            .find_map(|l| l.trim().strip_prefix("CARGO_ENCODED_RUSTFLAGS=\""))
            .and_then(|rest| rest.split_once("\" \\").map(|(flags, _)| flags))
            .expect("images/build.sh sets CARGO_ENCODED_RUSTFLAGS");
        assert_eq!(
            flags.replace("${sep}", "\x1f").replace("\\\"", "\""),
            encoded_rustflags()
        );
        assert!(script.contains(&format!("-Z build-std=core --target {TARGET}")));
        assert!(script.contains(&format!("{TARGET}/release/{ARTIFACT}\"")));
    }

    const RUSTC_VV: &str = "rustc 1.96.0 (ac68faa20 2026-05-25) (built from a source tarball)
binary: rustc
commit-hash: ac68faa20c58cbccd01ee7208bf3b6e93a7d7f96
commit-date: 2026-05-25
host: x86_64-unknown-linux-gnu
release: 1.96.0
LLVM version: 22.1.8
";

    fn defaults() -> Tools {
        Tools::from_lookup(|_| None)
    }

    fn host(root: bool, apt: bool, no_install: bool) -> Host {
        Host {
            root,
            apt: if apt {
                Ok(())
            } else {
                Err("apt-get needs root".to_owned())
            },
            no_install,
        }
    }

    fn checks(missing: &[Piece], wrong: &[Piece]) -> Vec<(Piece, Status)> {
        Piece::ALL
            .into_iter()
            .map(|p| {
                let status = if missing.contains(&p) {
                    Status::Missing("gone".to_owned())
                } else if wrong.contains(&p) {
                    Status::Wrong("old".to_owned())
                } else {
                    Status::Ok("fine".to_owned())
                };
                (p, status)
            })
            .collect()
    }

    fn failure(plan: Plan) -> String {
        match plan {
            Plan::Fail(message) => message,
            Plan::Install { .. } => panic!("expected a failure, got {plan:?}"),
        }
    }

    #[test]
    fn parses_rustc_vv() {
        let v = parse_rustc_vv(RUSTC_VV).unwrap();
        assert_eq!(
            v,
            RustcVersion {
                release: "1.96.0".into(),
                llvm: "22.1.8".into()
            }
        );
        assert_eq!(llvm_major(&v.llvm), Some(22));
        let no_llvm = RUSTC_VV.replace("LLVM version: 22.1.8\n", "");
        assert!(format!("{:#}", parse_rustc_vv(&no_llvm).unwrap_err()).contains("LLVM version"));
    }

    #[test]
    fn parses_tool_versions() {
        let cargo = "cargo 1.96.0 (30a34c682 2026-05-25) (built from a source tarball)\n";
        assert_eq!(parse_tool_version(cargo, "cargo"), Some("1.96.0"));
        assert_eq!(
            parse_tool_version("bpf-linker 0.13.0\n", "bpf-linker"),
            Some("0.13.0")
        );
        assert_eq!(parse_tool_version("rustc 1.96.0", "cargo"), None);
        assert_eq!(parse_tool_version("", "cargo"), None);
    }

    #[test]
    fn reads_clippy_versions() {
        let front = parse_tool_version("clippy 0.1.96\n", "clippy").unwrap();
        assert_eq!(clippy_release(front).as_deref(), Some("1.96."));
        // rustup's proxy names its own (other) release.
        let rustup = parse_tool_version("clippy 0.1.95 (59807616e1 2026-04-14)\n", "clippy");
        assert_eq!(clippy_release(rustup.unwrap()).as_deref(), Some("1.95."));
        assert_eq!(clippy_release("1.96.0"), None);
        assert_eq!(clippy_release("0.x.96"), None);
        assert_eq!(clippy_release("0.1"), None);
        assert_eq!(
            vv_field(RUSTC_VV, "commit-hash:").as_deref(),
            Some("ac68faa20c58cbccd01ee7208bf3b6e93a7d7f96")
        );
        assert_eq!(vv_field(RUSTC_VV, "nope:"), None);
    }

    #[test]
    fn clippy_is_a_lint_only_piece() {
        assert!(!Piece::BUILD.contains(&Piece::Clippy));
        assert!(Piece::LINT.contains(&Piece::Clippy));
        assert!(Piece::BUILD.iter().all(|p| Piece::LINT.contains(p)));
        let tools = defaults();
        assert_eq!(tools.cargo_clippy, Path::new(DEFAULT_CARGO_CLIPPY));
        assert_eq!(tools.clippy_driver(), Path::new("/usr/bin/clippy-driver"));
        let moved = Tools::from_lookup(|name| {
            (name == ENV_CARGO_CLIPPY).then(|| OsString::from("/opt/rust/bin/cargo-clippy"))
        });
        assert_eq!(
            moved.clippy_driver(),
            Path::new("/opt/rust/bin/clippy-driver")
        );
        assert_eq!(moved.overridden, [Piece::Clippy]);

        let plan = decide(
            &checks(&[Piece::Clippy], &[]),
            &host(true, true, false),
            &defaults(),
        );
        assert_eq!(
            plan,
            Plan::Install {
                apt: vec![Piece::Clippy],
                bpf_linker: false
            }
        );
        let message = failure(decide(
            &checks(&[], &[Piece::Clippy]),
            &host(true, true, false),
            &defaults(),
        ));
        assert!(
            message.contains("--allow-downgrades 'rust-web-clippy=1.96.*'"),
            "{message}"
        );
        let message = failure(decide(
            &checks(&[Piece::Clippy], &[]),
            &host(false, false, false),
            &defaults(),
        ));
        assert!(message.contains("sudo env"), "{message}");
        assert!(message.contains("/usr/bin/cargo-clippy"), "{message}");
    }

    #[test]
    fn reads_llvm_major_from_ldd() {
        let ldd = "\tlinux-vdso.so.1 (0x00007ff67c588000)
\tlibLLVM.so.22.1 => /usr/lib/llvm-22/lib/libLLVM.so.22.1 (0x00007ff673200000)
\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007ff67301e000)\n";
        assert_eq!(ldd_llvm_major(ldd), Some(22));
        let old = "\tlibLLVM-14.so.1 => /lib/x86_64-linux-gnu/libLLVM-14.so.1 (0x1)\n";
        assert_eq!(ldd_llvm_major(old), Some(14));
        assert_eq!(ldd_llvm_major("\tnot a dynamic executable\n"), None);
    }

    #[test]
    fn names_rust_src_release() {
        assert_eq!(
            rust_src_release(Path::new("/usr/src/rustc-1.96.0")).as_deref(),
            Some("1.96.0")
        );
        assert_eq!(
            rust_src_release(Path::new("/usr/lib/rustlib/src/rust")),
            None
        );
    }

    #[test]
    fn picks_pinned_apt_version() {
        let madison = " rustc-web | 1.97.0+dfsg1-1~deb12u1 | http://deb.debian.org/debian-security bookworm-security/main amd64 Packages
 rustc-web | 1.96.0+dfsg1-1~deb12u2 | http://deb.debian.org/debian-security bookworm-security/main amd64 Packages
 rustc-web | 1.85.0+dfsg3-1~deb12u3 | http://deb.debian.org/debian bookworm/main amd64 Packages
";
        let policy = "rustc-web:\n  Installed: (none)\n  Candidate: 1.97.0+dfsg1-1~deb12u1\n";
        let (version, note) = pick_apt_version("rustc-web", "1.96.", madison, policy).unwrap();
        assert_eq!(version, "1.96.0+dfsg1-1~deb12u2");
        assert!(note.unwrap().contains("candidate for rustc-web is 1.97.0"));

        let policy = "rustc-web:\n  Installed: (none)\n  Candidate: 1.96.0+dfsg1-1~deb12u2\n";
        let (_, note) = pick_apt_version("rustc-web", "1.96.", madison, policy).unwrap();
        assert_eq!(note, None);

        let err = pick_apt_version("rustc-web", "1.98.", madison, policy).unwrap_err();
        assert!(err.to_string().contains("1.85.0+dfsg3-1~deb12u3"), "{err}");
        assert!(pick_apt_version("rustc-web", "1.96.", "", "").is_err());

        let llvm = "llvm-22-dev | 1:22.1.8-1~deb12u1 | http://deb.debian.org/debian-security bookworm-security/main amd64 Packages\n";
        let (version, _) = pick_apt_version("llvm-22-dev", "22.", llvm, "").unwrap();
        assert_eq!(version, "1:22.1.8-1~deb12u1");
    }

    #[test]
    fn strips_epoch_and_revision() {
        assert_eq!(upstream_version("1:22.1.8-1~deb12u1"), "22.1.8");
        assert_eq!(upstream_version("1.96.0+dfsg1-1~deb12u2"), "1.96.0+dfsg1");
        assert_eq!(upstream_version("1.96.0"), "1.96.0");
    }

    #[test]
    fn filters_child_env() {
        for name in [
            "RUSTUP_TOOLCHAIN",
            "RUSTFLAGS",
            "RUSTC_WRAPPER",
            "RUSTC_WORKSPACE_WRAPPER",
            "RUSTDOC",
            "CARGO",
            "CARGO_TARGET_DIR",
            "CARGO_BUILD_RUSTFLAGS",
            "CARGO_ENCODED_RUSTFLAGS",
            "CARGO_MANIFEST_DIR",
            "CARGO_PKG_NAME",
            "CARGO_PROFILE_RELEASE_DEBUG",
            "CARGO_HOMEX",
        ] {
            assert!(drop_from_child_env(name), "{name} should be dropped");
        }
        for name in [
            "CARGO_HOME",
            "CARGO_INSTALL_ROOT",
            "CARGO_REGISTRIES_CRATES_IO_PROTOCOL",
            "CARGO_NET_OFFLINE",
            "CARGO_TERM_COLOR",
            "CARGO_HTTP_TIMEOUT",
            "PATH",
            "HOME",
            "RUSTUP_HOME",
        ] {
            assert!(!drop_from_child_env(name), "{name} should stay");
        }
    }

    #[test]
    fn cleans_search_paths() {
        let value = OsStr::new(
            "/work/main/target/debug:/root/.rustup/toolchains/1.95.0/lib::/opt/lib:/usr/lib",
        );
        let drop = [
            PathBuf::from("/work/main/target"),
            PathBuf::from("/root/.rustup/toolchains"),
        ];
        assert_eq!(clean_search_path(value, &drop), "/opt/lib:/usr/lib");
        assert_eq!(
            prepend_path(Path::new("/root/.cargo/bin"), OsStr::new("/usr/bin")),
            "/root/.cargo/bin:/usr/bin"
        );
        assert_eq!(prepend_path(Path::new("/x"), OsStr::new("")), "/x");
    }

    #[test]
    fn encodes_rustflags() {
        let flags = encoded_rustflags();
        assert_eq!(
            flags.split('\x1f').collect::<Vec<_>>(),
            [
                "--cfg=bpf_target_arch=\"x86_64\"",
                "-Cdebuginfo=2",
                "-Clink-arg=--btf"
            ]
        );
    }

    #[test]
    fn overrides_tool_paths() {
        let tools = defaults();
        assert_eq!(tools.rustc, Path::new(DEFAULT_RUSTC));
        assert_eq!(tools.llvm_prefix(), Path::new("/usr/lib/llvm-22"));
        assert!(tools.overridden.is_empty());
        let moved = Tools::from_lookup(|name| {
            (name == ENV_LLVM_CONFIG).then(|| OsString::from("/opt/llvm/bin/llvm-config"))
        });
        assert_eq!(moved.llvm_prefix(), Path::new("/opt/llvm"));
        let odd = Tools::from_lookup(|name| {
            (name == ENV_LLVM_CONFIG).then(|| OsString::from("/nonexistent/llvm-config"))
        });
        assert_eq!(odd.llvm_prefix(), Path::new("/usr/lib/llvm-22"));

        let tools = Tools::from_lookup(|name| match name {
            ENV_BPF_LINKER => Some("/nonexistent/bpf-linker".into()),
            ENV_CARGO => Some("/opt/cargo".into()),
            ENV_RUSTC => Some("".into()),
            _ => None,
        });
        assert_eq!(tools.cargo, Path::new("/opt/cargo"));
        assert_eq!(tools.rustc, Path::new(DEFAULT_RUSTC));
        assert_eq!(
            tools.bpf_linker.as_deref(),
            Some(Path::new("/nonexistent/bpf-linker"))
        );
        assert_eq!(tools.overridden, [Piece::Rust, Piece::BpfLinker]);
    }

    #[test]
    fn installs_what_is_missing_as_root_on_debian() {
        let plan = decide(
            &checks(&[Piece::Llvm, Piece::BpfLinker], &[]),
            &host(true, true, false),
            &defaults(),
        );
        assert_eq!(
            plan,
            Plan::Install {
                apt: vec![Piece::Llvm],
                bpf_linker: true
            }
        );
        let plan = decide(&checks(&[], &[]), &host(true, true, false), &defaults());
        assert_eq!(
            plan,
            Plan::Install {
                apt: vec![],
                bpf_linker: false
            }
        );
    }

    #[test]
    fn installs_bpf_linker_without_root() {
        let plan = decide(
            &checks(&[Piece::BpfLinker], &[]),
            &host(false, false, false),
            &defaults(),
        );
        assert_eq!(
            plan,
            Plan::Install {
                apt: vec![],
                bpf_linker: true
            }
        );
    }

    #[test]
    fn names_missing_piece_and_command_without_root() {
        let message = failure(decide(
            &checks(&[Piece::RustSrc], &[]),
            &host(false, false, false),
            &defaults(),
        ));
        assert!(message.contains(DEFAULT_RUST_SRC_LOCK), "{message}");
        assert!(message.contains("gone"), "{message}");
        assert!(
            message.contains(
                "sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y \
                 --no-install-recommends 'rust-web-src=1.96.*'"
            ),
            "{message}"
        );
        assert!(
            message.contains("not installing: apt-get needs root"),
            "{message}"
        );
        assert!(!message.contains("llvm"), "{message}");
    }

    #[test]
    fn never_replaces_wrong_versions() {
        let message = failure(decide(
            &checks(&[Piece::Llvm], &[Piece::Rust, Piece::BpfLinker]),
            &host(true, true, false),
            &defaults(),
        ));
        assert!(message.contains("--allow-downgrades 'rustc-web=1.96.*' 'cargo-web=1.96.*'"));
        assert!(
            message.contains("--no-install-recommends llvm-22-dev"),
            "{message}"
        );
        assert!(message.contains("--features llvm-22 --force"), "{message}");
        assert!(message.contains("wrong version"), "{message}");
    }

    #[test]
    fn respects_no_install_and_overrides() {
        let message = failure(decide(
            &checks(&[Piece::BpfLinker], &[]),
            &host(true, true, true),
            &defaults(),
        ));
        assert!(message.contains("--no-install"), "{message}");
        assert!(
            message.contains(
                "PATH=/usr/lib/llvm-22/bin:$PATH LLVM_PREFIX=/usr/lib/llvm-22 cargo install \
                 bpf-linker --version 0.13.0 --locked --no-default-features --features llvm-22"
            ),
            "{message}"
        );

        let tools = Tools::from_lookup(|name| {
            (name == ENV_BPF_LINKER).then(|| OsString::from("/nonexistent"))
        });
        let message = failure(decide(
            &checks(&[Piece::BpfLinker], &[]),
            &host(true, true, false),
            &tools,
        ));
        assert!(message.contains("KPULSE_BPF_LINKER overrides"), "{message}");
    }

    /// A little-endian ELF64 BPF file with the given section names and no contents.
    fn fake_elf(names: &[&str]) -> Vec<u8> {
        let mut strtab = vec![0u8];
        let mut offsets = vec![0u32];
        for name in names {
            offsets.push(u32::try_from(strtab.len()).unwrap());
            strtab.extend_from_slice(name.as_bytes());
            strtab.push(0);
        }
        let shstrndx = names.len(); // the name table is the last section
        let shoff = 64 + strtab.len();
        let shnum = names.len() + 1;
        let mut elf = vec![0u8; 64];
        elf[..4].copy_from_slice(b"\x7fELF");
        elf[4] = 2;
        elf[5] = 1;
        elf[0x12..0x14].copy_from_slice(&247u16.to_le_bytes());
        elf[0x28..0x30].copy_from_slice(&(shoff as u64).to_le_bytes());
        elf[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
        elf[0x3c..0x3e].copy_from_slice(&(shnum as u16).to_le_bytes());
        elf[0x3e..0x40].copy_from_slice(&(shstrndx as u16).to_le_bytes());
        elf.extend_from_slice(&strtab);
        for (index, name_off) in offsets.iter().enumerate() {
            let mut sh = [0u8; 64];
            sh[..4].copy_from_slice(&name_off.to_le_bytes());
            if index == shstrndx {
                sh[0x18..0x20].copy_from_slice(&64u64.to_le_bytes());
                sh[0x20..0x28].copy_from_slice(&(strtab.len() as u64).to_le_bytes());
            }
            elf.extend_from_slice(&sh);
        }
        elf
    }

    #[test]
    fn lists_elf_sections() {
        let elf = fake_elf(&[".text", ".BTF", "iter/cgroup", ".shstrtab"]);
        assert_eq!(
            elf_section_names(&elf).unwrap(),
            ["", ".text", ".BTF", "iter/cgroup", ".shstrtab"]
        );
    }

    #[test]
    fn rejects_bad_elf() {
        assert!(elf_section_names(b"not an elf").is_err());
        let elf = fake_elf(&[".text", ".shstrtab"]);
        assert!(elf_section_names(&elf[..elf.len() - 10]).is_err());
        let mut x86 = elf.clone();
        x86[0x12] = 62;
        let err = elf_section_names(&x86).unwrap_err();
        assert!(err.to_string().contains("not a BPF object"), "{err}");
        let mut big_endian = elf;
        big_endian[5] = 2;
        assert!(elf_section_names(&big_endian).is_err());
    }
}
