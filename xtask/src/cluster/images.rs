//! Container images for the local cluster, built here: no registry can be reached.
//!
//! - **Base images**, made from Debian's packages with `mmdebstrap` (which uses this
//!   machine's apt sources) and committed with `buildah` under the names the repository's
//!   Containerfiles use, so that those files build unchanged:
//!   - `docker.io/library/rust:<toolchain>-bookworm`: Debian 12 minbase with gcc and the
//!     C library headers, and this machine's rustup toolchain of `rust-toolchain.toml`
//!     (without its documentation) under `/usr/local/rustup`, as the official image lays
//!     it out (`RUSTUP_HOME`, `CARGO_HOME`, `PATH`);
//!   - `gcr.io/distroless/cc-debian12` and `:nonroot`: the files of Debian 12's `libc6`,
//!     `libgcc-s1`, `libstdc++6`, `libssl3`, `netbase` and `base-files` (extracted, no
//!     shell, no package manager), the CA bundle, and the `root`/`nonroot`/`nobody` users.
//! - **kpulse images**: `buildah bud` of `agent/Containerfile` and
//!   `aggregator-api/Containerfile` from the repository root, exactly as an operator would
//!   build them (`--layers`, `--pull=never`), tagged with the names `deploy/base` uses.
//! - **Cluster add-ons**: `kpulse.local/pause` (the sandbox image: `pause.c` beside this
//!   file, static), CoreDNS and metrics-server (their static Go binaries on an empty image),
//!   `kpulse.local/busybox` (Debian's static busybox, for test workloads).
//!
//! Every image is written as a docker archive into `target/cluster/images/` and imported
//! into containerd's `k8s.io` namespace, where the kubelet finds it without pulling.
//! buildah's storage, run root and build-cache mounts live under `target/cluster/images/`.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{bail, ensure, Context, Result};

use super::versions;

/// The sandbox image containerd pins (its `sandbox` setting).
pub fn pause_image() -> String {
    format!("kpulse.local/pause:{}", versions::PAUSE_TAG)
}
/// CoreDNS, from its module.
pub fn coredns_image() -> String {
    format!("kpulse.local/coredns:{}", versions::COREDNS)
}
/// metrics-server, under the name its own manifests use.
pub fn metrics_server_image() -> String {
    format!(
        "registry.k8s.io/metrics-server/metrics-server:v{}",
        versions::METRICS_SERVER
    )
}
/// Static busybox for test workloads.
pub const BUSYBOX_IMAGE: &str = "kpulse.local/busybox:latest";
/// The host's busybox that [`BUSYBOX_IMAGE`] is made of.
pub const HOST_BUSYBOX: &str = "/bin/busybox";
/// The distroless runtime image of the Containerfiles, and its `nonroot` variant.
pub const DISTROLESS: &str = "gcr.io/distroless/cc-debian12:latest";
pub const DISTROLESS_NONROOT: &str = "gcr.io/distroless/cc-debian12:nonroot";
/// The kpulse images, as `deploy/base/kustomization.yaml` names them.
pub const KPULSE_IMAGES: [(&str, &str); 2] = [
    ("agent/Containerfile", "ghcr.io/kpulse/kpulse-agent:0.1.0"),
    (
        "aggregator-api/Containerfile",
        "ghcr.io/kpulse/kpulse-aggregator-api:0.1.0",
    ),
];

/// buildah with this project's storage.
pub struct Builder {
    pub dir: PathBuf,
    root: PathBuf,
}

impl Builder {
    pub fn new(workspace: &Path) -> Result<Builder> {
        let dir = workspace.join("target/cluster/images");
        for d in ["storage", "run", "tmp", "archives", "rootfs"] {
            fs::create_dir_all(dir.join(d))
                .with_context(|| format!("cannot create {}", dir.join(d).display()))?;
        }
        Ok(Builder {
            dir,
            root: workspace.to_path_buf(),
        })
    }

    /// `buildah` with the global storage options; `TMPDIR` holds its build-cache mounts.
    fn buildah(&self) -> Command {
        let mut cmd = Command::new("buildah");
        cmd.arg("--root")
            .arg(self.dir.join("storage"))
            .arg("--runroot")
            .arg(self.dir.join("run"))
            .args(["--storage-driver", "overlay"])
            .env("TMPDIR", self.dir.join("tmp"))
            .env("BUILDAH_ISOLATION", "chroot");
        cmd
    }

    fn has_image(&self, name: &str) -> bool {
        self.buildah()
            .args(["inspect", "--type", "image", name])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// Commits `rootfs` (a directory) as image `name` with `config` (buildah config flags).
    fn commit_dir(&self, rootfs: &Path, name: &str, config: &[String]) -> Result<()> {
        let ctr = crate::exec::output(self.buildah().args(["from", "scratch"]))?
            .trim()
            .to_string();
        let result = (|| {
            let mnt = crate::exec::output(self.buildah().args(["mount", &ctr]))?
                .trim()
                .to_string();
            // cp -a keeps owners, modes, symlinks and hard links.
            crate::exec::run(
                Command::new("cp")
                    .arg("-a")
                    .arg(format!("{}/.", rootfs.display()))
                    .arg(&mnt),
            )?;
            crate::exec::run(self.buildah().args(["umount", &ctr]))?;
            if !config.is_empty() {
                crate::exec::run(self.buildah().arg("config").args(config).arg(&ctr))?;
            }
            crate::exec::run(self.buildah().args(["commit", "--quiet", &ctr, name]))
        })();
        let _ = self
            .buildah()
            .args(["rm", &ctr])
            .stdout(std::process::Stdio::null())
            .status();
        result
    }

    /// Writes image `name` as a docker archive for containerd; returns its path.
    fn archive(&self, name: &str) -> Result<PathBuf> {
        let file = self
            .dir
            .join("archives")
            .join(format!("{}.tar", name.replace(['/', ':'], "_")));
        let _ = fs::remove_file(&file);
        crate::exec::run(self.buildah().args([
            "push",
            "--quiet",
            name,
            &format!("docker-archive:{}:{name}", file.display()),
        ]))?;
        Ok(file)
    }

    /// The base images of the kpulse Containerfiles, made once and kept.
    pub fn base_images(&self) -> Result<()> {
        let rust = rust_base_name()?;
        if !self.has_image(&rust) {
            let started = Instant::now();
            println!(
                "cluster: making {rust} from Debian {} packages and this machine's rustup \
                 toolchain (once; about 2 min)",
                versions::DEBIAN_SUITE
            );
            let rootfs = self.dir.join("rootfs/rust");
            let _ = fs::remove_dir_all(&rootfs);
            mmdebstrap(
                &rootfs,
                "minbase",
                &["gcc", "libc6-dev", "ca-certificates", "pkg-config", "make"],
            )?;
            copy_rust_toolchain(&rootfs)?;
            // This machine's trust store: it holds the CAs this machine needs to reach
            // crates.io (the Containerfiles' builds fetch crates), which Debian's bundle may not.
            let bundle = Path::new("/etc/ssl/certs/ca-certificates.crt");
            if bundle.is_file() {
                fs::copy(bundle, rootfs.join("etc/ssl/certs/ca-certificates.crt"))
                    .context("cannot copy this machine's CA bundle into the build image")?;
            }
            let version = rust_toolchain_version(&self.root)?;
            self.commit_dir(
                &rootfs,
                &rust,
                &[
                    "--env".into(),
                    "RUSTUP_HOME=/usr/local/rustup".into(),
                    "--env".into(),
                    "CARGO_HOME=/usr/local/cargo".into(),
                    "--env".into(),
                    "PATH=/usr/local/cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
                        .into(),
                    "--env".into(),
                    format!("RUST_VERSION={version}"),
                    "--cmd".into(),
                    "bash".into(),
                ],
            )?;
            let _ = fs::remove_dir_all(&rootfs);
            println!(
                "cluster: {rust} made in {:.0} s",
                started.elapsed().as_secs_f64()
            );
        }
        if !self.has_image(DISTROLESS) || !self.has_image(DISTROLESS_NONROOT) {
            println!("cluster: making {DISTROLESS} (and :nonroot) from Debian packages");
            let rootfs = self.dir.join("rootfs/distroless");
            let _ = fs::remove_dir_all(&rootfs);
            mmdebstrap(
                &rootfs,
                "extract",
                &[
                    "base-files",
                    "netbase",
                    "libc6",
                    "libgcc-s1",
                    "libstdc++6",
                    "libssl3",
                ],
            )?;
            distroless_files(&rootfs)?;
            self.commit_dir(&rootfs, DISTROLESS, &[])?;
            self.commit_dir(
                &rootfs,
                DISTROLESS_NONROOT,
                &[
                    "--user".into(),
                    "65532:65532".into(),
                    "--workingdir".into(),
                    "/home/nonroot".into(),
                ],
            )?;
            let _ = fs::remove_dir_all(&rootfs);
        }
        Ok(())
    }

    /// Builds the kpulse images from their Containerfiles; returns the archives.
    pub fn kpulse_images(&self) -> Result<Vec<PathBuf>> {
        let object = self.root.join("target/ebpf/kpulse.bpf.o");
        ensure!(
            object.is_file(),
            "{} is missing: `cargo xtask build-ebpf --release` makes it",
            object.display()
        );
        let mut archives = Vec::new();
        for (file, name) in KPULSE_IMAGES {
            let started = Instant::now();
            println!("cluster: buildah bud -f {file} -t {name} . (cold: several minutes)");
            crate::exec::run(
                self.buildah()
                    .current_dir(&self.root)
                    .args(["bud", "--layers", "--pull=never", "--quiet"])
                    .args(["--isolation", "chroot", "-f", file, "-t", name, "."]),
            )?;
            println!(
                "cluster: {name} built in {:.0} s",
                started.elapsed().as_secs_f64()
            );
            archives.push(self.archive(name)?);
        }
        Ok(archives)
    }

    /// A single-binary image: `binary` at `/<dest>` (and the given extra files), run as
    /// `entrypoint`, on an empty base.
    fn binary_image(
        &self,
        name: &str,
        files: &[(&Path, &str)],
        entrypoint: &str,
        user: Option<&str>,
    ) -> Result<PathBuf> {
        let rootfs = self.dir.join("rootfs").join(name.replace(['/', ':'], "_"));
        let _ = fs::remove_dir_all(&rootfs);
        for d in ["etc", "tmp"] {
            fs::create_dir_all(rootfs.join(d))?;
        }
        fs::write(
            rootfs.join("etc/passwd"),
            "root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n",
        )?;
        fs::write(rootfs.join("etc/group"), "root:x:0:\nnogroup:x:65534:\n")?;
        for (src, dest) in files {
            let to = rootfs.join(dest.trim_start_matches('/'));
            if let Some(parent) = to.parent() {
                fs::create_dir_all(parent)?;
            }
            fs::copy(src, &to)
                .with_context(|| format!("cannot copy {} to {}", src.display(), to.display()))?;
        }
        crate::exec::run(Command::new("chmod").arg("1777").arg(rootfs.join("tmp")))?;
        let mut config = vec![
            "--entrypoint".to_string(),
            format!("[\"{entrypoint}\"]"),
            "--cmd".to_string(),
            String::new(),
        ];
        if let Some(u) = user {
            config.push("--user".into());
            config.push(u.into());
        }
        self.commit_dir(&rootfs, name, &config)?;
        let _ = fs::remove_dir_all(&rootfs);
        self.archive(name)
    }

    /// The add-on images; returns their archives.
    pub fn addon_images(&self, coredns: &Path, metrics_server: &Path) -> Result<Vec<PathBuf>> {
        let mut archives = Vec::new();
        let pause_bin = self.dir.join("pause");
        let source = self.root.join("xtask/src/cluster/pause.c");
        crate::exec::run(
            Command::new("gcc")
                .args(["-static", "-Os", "-Wall", "-Werror", "-o"])
                .arg(&pause_bin)
                .arg(&source),
        )
        .context("building the pause program needs gcc and the static C library (libc6-dev)")?;
        archives.push(self.binary_image(
            &pause_image(),
            &[(&pause_bin, "/pause")],
            "/pause",
            Some("65535:65535"),
        )?);
        archives.push(self.binary_image(
            &coredns_image(),
            &[(coredns, "/coredns")],
            "/coredns",
            None,
        )?);
        archives.push(self.binary_image(
            &metrics_server_image(),
            &[(metrics_server, "/metrics-server")],
            "/metrics-server",
            Some("65534:65534"),
        )?);
        let busybox = Path::new(HOST_BUSYBOX);
        ensure!(
            busybox.is_file(),
            "{} is missing (Debian's busybox-static)",
            busybox.display()
        );
        archives.push(self.busybox_image(busybox)?);
        Ok(archives)
    }

    fn busybox_image(&self, busybox: &Path) -> Result<PathBuf> {
        let rootfs = self.dir.join("rootfs/busybox");
        let _ = fs::remove_dir_all(&rootfs);
        for d in ["bin", "etc", "tmp"] {
            fs::create_dir_all(rootfs.join(d))?;
        }
        fs::copy(busybox, rootfs.join("bin/busybox"))?;
        for applet in [
            "sh", "sleep", "cat", "ls", "echo", "date", "yes", "dd", "head", "sync",
        ] {
            std::os::unix::fs::symlink("busybox", rootfs.join("bin").join(applet))?;
        }
        fs::write(
            rootfs.join("etc/passwd"),
            "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/sh\n",
        )?;
        crate::exec::run(Command::new("chmod").arg("1777").arg(rootfs.join("tmp")))?;
        self.commit_dir(
            &rootfs,
            BUSYBOX_IMAGE,
            &["--cmd".into(), "[\"/bin/sh\"]".into()],
        )?;
        let _ = fs::remove_dir_all(&rootfs);
        self.archive(BUSYBOX_IMAGE)
    }
}

/// `docker.io/library/rust:<channel>-bookworm` for the channel of `rust-toolchain.toml`.
fn rust_base_name() -> Result<String> {
    let root = crate::vm::workspace_root()?;
    Ok(format!(
        "docker.io/library/rust:{}-{}",
        rust_toolchain_version(&root)?,
        versions::DEBIAN_SUITE
    ))
}

/// The `channel` of `rust-toolchain.toml`.
fn rust_toolchain_version(root: &Path) -> Result<String> {
    let path = root.join("rust-toolchain.toml");
    let text =
        fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("channel"))
        .filter_map(|rest| rest.trim().strip_prefix('='))
        .map(|v| v.trim().trim_matches('"').to_string())
        .next()
        .with_context(|| format!("{} names no channel", path.display()))
}

/// A Debian root filesystem from this machine's apt sources.
fn mmdebstrap(dir: &Path, variant: &str, packages: &[&str]) -> Result<()> {
    crate::exec::run(
        Command::new("mmdebstrap")
            .args(["--quiet", "--mode=root", &format!("--variant={variant}")])
            .arg(format!("--include={}", packages.join(",")))
            .arg("--dpkgopt=path-exclude=/usr/share/doc/*")
            .arg("--dpkgopt=path-exclude=/usr/share/man/*")
            .arg(versions::DEBIAN_SUITE)
            .arg(dir),
    )
}

/// Copies the rustup toolchain of `rust-toolchain.toml` (bin, lib, libexec, etc; not its
/// documentation) and the `rustup` proxy into `rootfs` as the official image has them.
fn copy_rust_toolchain(rootfs: &Path) -> Result<()> {
    let root = crate::vm::workspace_root()?;
    let version = rust_toolchain_version(&root)?;
    let sysroot = crate::exec::output(
        Command::new("rustc")
            .current_dir(&root)
            .args(["--print", "sysroot"]),
    )?;
    let sysroot = fs::canonicalize(sysroot.trim())?;
    let dest = rootfs.join(format!(
        "usr/local/rustup/toolchains/{version}-x86_64-unknown-linux-gnu"
    ));
    fs::create_dir_all(&dest)?;
    for part in ["bin", "lib", "libexec", "etc"] {
        let src = sysroot.join(part);
        if src.exists() {
            crate::exec::run(Command::new("cp").arg("-a").arg(&src).arg(&dest))?;
        }
    }
    let rustup = which("rustup").context("rustup is not on PATH")?;
    let cargo_bin = rootfs.join("usr/local/cargo/bin");
    fs::create_dir_all(&cargo_bin)?;
    fs::copy(&rustup, cargo_bin.join("rustup"))?;
    for proxy in ["cargo", "rustc", "rustdoc", "rust-gdb", "rust-lldb"] {
        std::os::unix::fs::symlink("rustup", cargo_bin.join(proxy))?;
    }
    fs::write(
        rootfs.join("usr/local/rustup/settings.toml"),
        format!("version = \"12\"\nprofile = \"minimal\"\ndefault_toolchain = \"{version}-x86_64-unknown-linux-gnu\"\n"),
    )?;
    Ok(())
}

fn which(cmd: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|d| d.join(cmd))
            .find(|p| p.is_file())
    })
}

/// The files distroless adds to its packages: users, groups, a home for `nonroot`, `/tmp`,
/// and the CA bundle.
fn distroless_files(rootfs: &Path) -> Result<()> {
    fs::create_dir_all(rootfs.join("etc/ssl/certs"))?;
    fs::create_dir_all(rootfs.join("home/nonroot"))?;
    fs::create_dir_all(rootfs.join("tmp"))?;
    fs::write(
        rootfs.join("etc/passwd"),
        "root:x:0:0:root:/root:/sbin/nologin\n\
         nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n\
         nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n",
    )?;
    fs::write(
        rootfs.join("etc/group"),
        "root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n",
    )?;
    let bundle = Path::new("/etc/ssl/certs/ca-certificates.crt");
    if bundle.is_file() {
        fs::copy(bundle, rootfs.join("etc/ssl/certs/ca-certificates.crt"))?;
    }
    crate::exec::run(
        Command::new("chown")
            .arg("65532:65532")
            .arg(rootfs.join("home/nonroot")),
    )?;
    crate::exec::run(Command::new("chmod").arg("1777").arg(rootfs.join("tmp")))?;
    // The extract variant leaves dpkg's and apt's state behind: distroless has neither.
    for leftover in ["var/lib/dpkg", "var/lib/apt", "var/cache/apt", "etc/apt"] {
        let p = rootfs.join(leftover);
        if p.exists() {
            fs::remove_dir_all(&p)?;
        }
    }
    Ok(())
}

/// Imports docker archives into containerd's `k8s.io` namespace.
pub fn import(ctr: &Path, address: &Path, archives: &[PathBuf]) -> Result<()> {
    for a in archives {
        let out = Command::new(ctr)
            .arg("--address")
            .arg(address)
            .args(["-n", "k8s.io", "images", "import"])
            .arg(a)
            .output()
            .with_context(|| format!("cannot run {}", ctr.display()))?;
        if !out.status.success() {
            bail!(
                "ctr images import {} failed: {}",
                a.display(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    Ok(())
}
