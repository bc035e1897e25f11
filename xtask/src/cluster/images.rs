//! Container images for the local cluster, built here: no registry can be reached.
//!
//! - **Base images**, made from Debian's packages with `mmdebstrap` and committed with
//!   `buildah` under the names the repository's `Containerfile` uses, so that it builds
//!   unchanged:
//!   - `docker.io/library/debian:bookworm` (this machine's architecture: the build stage
//!     runs here): Debian 12 minbase with the official image's apt sources and this
//!     machine's own CAs;
//!   - `gcr.io/distroless/cc-debian12` and `:nonroot`: manifest lists of one image per
//!     architecture of [`ARCHES`], each the files of that architecture's Debian 12 `libc6`,
//!     `libgcc-s1`, `libstdc++6`, `libssl3`, `netbase` and `base-files` (extracted, no
//!     shell, no package manager), the CA bundle, and the `root`/`nonroot`/`nobody` users.
//! - **kpulse images**: `buildah build --platform linux/amd64,linux/arm64 --target <image>
//!   --manifest <name>` of the `Containerfile` from the repository root, exactly as an
//!   operator would build them (plus `--layers`, `--pull=never`), named as `deploy/base`
//!   names them; then every architecture's binary is run once (`--version`: natively in a
//!   chroot of its image, or under qemu's user-mode emulator with the image's C library),
//!   and the agent image of every other architecture is booted on that architecture's
//!   kernel ([`super::agent_in_vm`]).
//! - **Cluster add-ons**: `kpulse.local/pause` (the sandbox image: `pause.c` beside this
//!   file, static, a manifest list for amd64 and arm64: the arm64 node pins it too), CoreDNS and metrics-server (their static Go binaries on an empty image),
//!   `kpulse.local/busybox` (Debian's static busybox, for test workloads).
//!
//! Every image is written as an archive into `target/cluster/images/` (OCI with every
//! architecture for the kpulse images, docker for the others) and imported into
//! containerd's `k8s.io` namespace, where the kubelet finds it without pulling.
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
/// The Containerfile of kpulse's images, from the repository root.
pub const CONTAINERFILE: &str = "Containerfile";
/// The architectures kpulse's images are built for (Debian's and OCI's names).
pub const ARCHES: [&str; 2] = ["amd64", "arm64"];
/// The Containerfile's build stage: Debian 12, for this machine's architecture only.
pub const DEBIAN: &str = "docker.io/library/debian:bookworm";
/// The distroless runtime image of the Containerfile, and its `nonroot` variant: manifest
/// lists of every architecture of [`ARCHES`].
pub const DISTROLESS: &str = "gcr.io/distroless/cc-debian12:latest";
pub const DISTROLESS_NONROOT: &str = "gcr.io/distroless/cc-debian12:nonroot";
/// The Containerfile's agent stage: its image is also run on a kernel of each other
/// architecture (`agent_in_vm`).
const AGENT_TARGET: &str = "agent";
/// The agent's image, as `deploy/base/kustomization.yaml` names it.
pub const AGENT_IMAGE: &str = "ghcr.io/kpulse/kpulse-agent:0.1.0";
/// The kpulse images: the Containerfile's `--target` and the name `deploy/base/kustomization.yaml`
/// gives the image.
pub const KPULSE_IMAGES: [(&str, &str); 2] = [
    (AGENT_TARGET, AGENT_IMAGE),
    (
        "aggregator-api",
        "ghcr.io/kpulse/kpulse-aggregator-api:0.1.0",
    ),
];

/// An image written for containerd to import.
pub struct Archive {
    pub path: PathBuf,
    /// For an OCI archive (a manifest list), the image's repository: OCI names only the tag,
    /// and `ctr images import --base-name` adds the rest.
    base_name: Option<String>,
}

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

    fn archive_path(&self, name: &str) -> PathBuf {
        self.dir
            .join("archives")
            .join(format!("{}.tar", name.replace(['/', ':'], "_")))
    }

    /// Writes image `name` as a docker archive for containerd.
    fn archive(&self, name: &str) -> Result<Archive> {
        let file = self.archive_path(name);
        let _ = fs::remove_file(&file);
        crate::exec::run(self.buildah().args([
            "push",
            "--quiet",
            name,
            &format!("docker-archive:{}:{name}", file.display()),
        ]))?;
        Ok(Archive {
            path: file,
            base_name: None,
        })
    }

    /// The base images of the Containerfile, made once and kept: the build stage's Debian
    /// (this machine's architecture only: the toolchain runs here and cross-compiles), and
    /// the runtime's distroless as manifest lists of every architecture of [`ARCHES`].
    pub fn base_images(&self) -> Result<()> {
        if !self.has_image(DEBIAN) {
            let started = Instant::now();
            println!("cluster: making {DEBIAN} from Debian packages (once; about 30 s)");
            let rootfs = self.dir.join("rootfs/debian");
            let _ = fs::remove_dir_all(&rootfs);
            mmdebstrap(&rootfs, "minbase", host_arch(), &["ca-certificates"])?;
            debian_files(&rootfs)?;
            self.commit_dir(
                &rootfs,
                DEBIAN,
                &[
                    "--arch".into(),
                    host_arch().into(),
                    "--os".into(),
                    "linux".into(),
                    "--env".into(),
                    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
                    "--cmd".into(),
                    "bash".into(),
                ],
            )?;
            let _ = fs::remove_dir_all(&rootfs);
            println!(
                "cluster: {DEBIAN} made in {:.0} s",
                started.elapsed().as_secs_f64()
            );
        }
        if !self.has_manifest(DISTROLESS) || !self.has_manifest(DISTROLESS_NONROOT) {
            println!(
                "cluster: making {DISTROLESS} (and :nonroot) for {} from Debian packages",
                ARCHES.join(" and ")
            );
            let mut instances = Vec::new();
            for arch in ARCHES {
                let rootfs = self.dir.join(format!("rootfs/distroless-{arch}"));
                let _ = fs::remove_dir_all(&rootfs);
                mmdebstrap(
                    &rootfs,
                    "extract",
                    arch,
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
                let platform = [
                    "--arch".to_string(),
                    arch.into(),
                    "--os".into(),
                    "linux".into(),
                ];
                let root_name = format!("kpulse.local/distroless-cc:{arch}");
                let nonroot_name = format!("kpulse.local/distroless-cc:{arch}-nonroot");
                self.commit_dir(&rootfs, &root_name, &platform)?;
                let mut nonroot = platform.to_vec();
                nonroot.extend([
                    "--user".into(),
                    "65532:65532".into(),
                    "--workingdir".into(),
                    "/home/nonroot".into(),
                ]);
                self.commit_dir(&rootfs, &nonroot_name, &nonroot)?;
                let _ = fs::remove_dir_all(&rootfs);
                instances.push((root_name, nonroot_name));
            }
            let (root, nonroot): (Vec<String>, Vec<String>) = instances.into_iter().unzip();
            self.manifest_of(DISTROLESS, &root)?;
            self.manifest_of(DISTROLESS_NONROOT, &nonroot)?;
        }
        Ok(())
    }

    /// Whether `name` is a manifest list with an image for every architecture of [`ARCHES`].
    fn has_manifest(&self, name: &str) -> bool {
        let Ok(json) = crate::exec::output(self.buildah().args(["manifest", "inspect", name]))
        else {
            return false;
        };
        manifest_instances(&json).is_ok_and(|arches| ARCHES.iter().all(|a| arches.contains_key(*a)))
    }

    /// Removes whatever is called `name`: a manifest list or an image.
    fn remove_name(&self, name: &str) {
        for args in [["manifest", "rm", name], ["rmi", "--force", name]] {
            let _ = self
                .buildah()
                .args(args)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status();
        }
    }

    /// Makes `name` the manifest list of the images `instances` (each of one architecture).
    fn manifest_of(&self, name: &str, instances: &[String]) -> Result<()> {
        self.remove_name(name);
        crate::exec::run(self.buildah().args(["manifest", "create", name]))?;
        for instance in instances {
            // By image ID: buildah 1.28 does not resolve a local name in `manifest add`.
            let id = crate::exec::output(self.buildah().args(["images", "--quiet", instance]))?;
            let id = id.lines().next().unwrap_or_default().trim().to_string();
            ensure!(!id.is_empty(), "buildah has no image {instance}");
            crate::exec::run(self.buildah().args(["manifest", "add", name, &id]))?;
        }
        Ok(())
    }

    /// Builds kpulse's images from the Containerfile, for every architecture of [`ARCHES`],
    /// each a manifest list; checks that every architecture's binary is there and runs;
    /// returns the archives.
    pub fn kpulse_images(&self, boot: bool) -> Result<Vec<Archive>> {
        let revision = crate::exec::output(
            Command::new("git")
                .current_dir(&self.root)
                .args(["rev-parse", "HEAD"]),
        )
        .map(|r| r.trim().to_string())
        .unwrap_or_else(|_| "unknown".to_string());
        let platforms = ARCHES
            .iter()
            .map(|a| format!("linux/{a}"))
            .collect::<Vec<_>>()
            .join(",");
        let host = host_arch();
        let mut archives = Vec::new();
        for (target, name) in KPULSE_IMAGES {
            let started = Instant::now();
            println!(
                "cluster: buildah build --platform {platforms} --target {target} --manifest \
                 {name} . (cold: about 15 min for both images)"
            );
            // `--manifest` adds to a list of that name: start from none.
            self.remove_name(name);
            crate::exec::run(
                self.buildah()
                    .current_dir(&self.root)
                    .args(["build", "--layers", "--pull=never", "--quiet"])
                    .args(["--isolation", "chroot", "--network", "host"])
                    .args(["--platform", &platforms, "--target", target])
                    // buildah 1.28 (Debian 12's) does not set these itself, as docker buildx and
                    // later buildahs do: without them the toolchain stage would be looked for
                    // in the target's architecture.
                    .args(["--build-arg", &format!("BUILDPLATFORM=linux/{host}")])
                    .args(["--build-arg", &format!("BUILDARCH={host}")])
                    .args(["--build-arg", &format!("REVISION={revision}")])
                    .args([
                        "--build-arg",
                        &format!("VERSION={}", repository_and_tag(name)?.1),
                    ])
                    .args(["--manifest", name, "-f", CONTAINERFILE, "."]),
            )?;
            println!(
                "cluster: {name} built in {:.0} s",
                started.elapsed().as_secs_f64()
            );
            self.check_instances(name, target, boot)?;
            archives.push(self.archive_manifest(name)?);
        }
        Ok(archives)
    }

    /// Every architecture's image of manifest list `name` holds `/usr/local/bin/<binary>` for
    /// that architecture, and it runs there: natively, or under `qemu-<machine>` (user mode)
    /// with the image's own C library.
    fn check_instances(&self, name: &str, target: &str, boot: bool) -> Result<()> {
        let json = crate::exec::output(self.buildah().args(["manifest", "inspect", name]))?;
        let instances = manifest_instances(&json)?;
        ensure!(
            ARCHES.iter().all(|a| instances.contains_key(*a)),
            "{name} has images for {:?}, not for every one of {ARCHES:?}",
            instances.keys().collect::<Vec<_>>()
        );
        let binary = format!("kpulse-{target}");
        for arch in ARCHES {
            let ctr = crate::exec::output(self.buildah().args([
                "from",
                "--pull=never",
                "--quiet",
                "--arch",
                arch,
                name,
            ]))?
            .trim()
            .to_string();
            let result = (|| -> Result<String> {
                let mnt = crate::exec::output(self.buildah().args(["mount", &ctr]))?
                    .trim()
                    .to_string();
                let exe = Path::new(&mnt).join("usr/local/bin").join(&binary);
                let machine = crate::vm::elf_machine_of(&exe)?;
                let want = crate::vm::Arch::from_debian(arch)?;
                ensure!(
                    machine == want.elf_machine(),
                    "{name} for {arch}: {} is an ELF for machine {machine}, not {arch}'s {}",
                    exe.display(),
                    want.elf_machine()
                );
                let mut cmd = if want == crate::vm::Arch::host() {
                    // The image's own loader and libraries, not this machine's.
                    let mut c = Command::new("chroot");
                    c.arg(&mnt).arg(format!("/usr/local/bin/{binary}"));
                    c
                } else {
                    let mut c = Command::new(want.qemu_user());
                    c.arg("-L").arg(&mnt).arg(&exe);
                    c
                };
                let out = crate::exec::output(cmd.arg("--version"))
                    .with_context(|| format!("{name} for {arch}: {binary} --version"))?;
                if target == AGENT_TARGET && want != crate::vm::Arch::host() {
                    if boot {
                        let digest = instances
                            .get(arch)
                            .with_context(|| format!("{name} has no {arch} image"))?;
                        super::agent_in_vm::check(
                            &self.root,
                            &self.dir,
                            name,
                            digest,
                            Path::new(&mnt),
                            want,
                        )?;
                    } else {
                        println!(
                            "cluster: {name} for {arch}: not booted on its kernel now \
                             (--no-image-boot): the next `up` or `build` does"
                        );
                    }
                }
                let _ = self
                    .buildah()
                    .args(["umount", &ctr])
                    .stdout(std::process::Stdio::null())
                    .status();
                Ok(out.trim().to_string())
            })();
            let _ = self
                .buildah()
                .args(["rm", &ctr])
                .stdout(std::process::Stdio::null())
                .status();
            let version = result?;
            ensure!(
                version.starts_with(&binary),
                "{name} for {arch}: `{binary} --version` printed {version:?}"
            );
            println!("cluster: {name} for {arch}: {version} runs");
        }
        Ok(())
    }

    /// Writes manifest list `name` with every image in it as an OCI archive for containerd.
    fn archive_manifest(&self, name: &str) -> Result<Archive> {
        let file = self.archive_path(name);
        let _ = fs::remove_file(&file);
        crate::exec::run(self.buildah().args([
            "manifest",
            "push",
            "--all",
            "--quiet",
            name,
            &format!("oci-archive:{}:{name}", file.display()),
        ]))?;
        let (repository, _) = repository_and_tag(name)?;
        Ok(Archive {
            path: file,
            base_name: Some(repository.to_string()),
        })
    }

    /// A single-binary image: `binary` at `/<dest>` (and the given extra files), run as
    /// `entrypoint`, on an empty base.
    fn binary_image(
        &self,
        name: &str,
        files: &[(&Path, &str)],
        entrypoint: &str,
        user: Option<&str>,
    ) -> Result<Archive> {
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
    pub fn addon_images(&self, coredns: &Path, metrics_server: &Path) -> Result<Vec<Archive>> {
        let mut archives = vec![self.pause_image()?];
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

    /// The sandbox image, a manifest list of every architecture of [`ARCHES`] (the arm64
    /// node's containerd pins the same name): `pause.c`, static, by this machine's C
    /// compiler and by Debian's cross-compiler for the other architecture.
    fn pause_image(&self) -> Result<Archive> {
        let source = self.root.join("xtask/src/cluster/pause.c");
        let mut instances = Vec::new();
        for arch in ARCHES {
            let compiler = c_compiler(arch)?;
            let bin = self.dir.join(format!("pause-{arch}"));
            crate::exec::run(
                Command::new(compiler)
                    .args(["-static", "-Os", "-Wall", "-Werror", "-o"])
                    .arg(&bin)
                    .arg(&source),
            )
            .with_context(|| {
                format!(
                    "building the {arch} pause program needs {compiler} and its static C library"
                )
            })?;
            let name = format!("{}-{arch}", pause_image());
            let rootfs = self.dir.join("rootfs").join(format!("pause-{arch}"));
            let _ = fs::remove_dir_all(&rootfs);
            fs::create_dir_all(&rootfs)?;
            fs::copy(&bin, rootfs.join("pause"))
                .with_context(|| format!("cannot copy {}", bin.display()))?;
            self.commit_dir(
                &rootfs,
                &name,
                &[
                    "--arch".into(),
                    arch.into(),
                    "--os".into(),
                    "linux".into(),
                    "--entrypoint".into(),
                    "[\"/pause\"]".into(),
                    "--cmd".into(),
                    String::new(),
                    "--user".into(),
                    "65535:65535".into(),
                ],
            )?;
            let _ = fs::remove_dir_all(&rootfs);
            instances.push(name);
        }
        self.manifest_of(&pause_image(), &instances)?;
        self.archive_manifest(&pause_image())
    }

    fn busybox_image(&self, busybox: &Path) -> Result<Archive> {
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

/// A Debian root filesystem of architecture `arch` from Debian's mirror (mmdebstrap's
/// default). The `extract` variant runs no package's scripts, so it needs no emulation for
/// another architecture.
fn mmdebstrap(dir: &Path, variant: &str, arch: &str, packages: &[&str]) -> Result<()> {
    crate::exec::run(
        Command::new("mmdebstrap")
            .args(["--quiet", "--mode=root", &format!("--variant={variant}")])
            .arg(format!("--architectures={arch}"))
            .arg(format!("--include={}", packages.join(",")))
            .arg("--dpkgopt=path-exclude=/usr/share/doc/*")
            .arg("--dpkgopt=path-exclude=/usr/share/man/*")
            .arg(versions::DEBIAN_SUITE)
            .arg(dir),
    )
}

/// The files the official `debian:bookworm` image has beside minbase's packages: its apt
/// sources (deb.debian.org: the release, its updates, its security updates), and this
/// machine's own CAs, which it needs to reach crates.io and Debian (the Containerfile's
/// build fetches crates and packages); `update-ca-certificates` keeps them in the bundle.
fn debian_files(rootfs: &Path) -> Result<()> {
    let suite = versions::DEBIAN_SUITE;
    let _ = fs::remove_file(rootfs.join("etc/apt/sources.list"));
    fs::create_dir_all(rootfs.join("etc/apt/sources.list.d"))?;
    fs::write(
        rootfs.join("etc/apt/sources.list.d/debian.sources"),
        format!(
            "Types: deb\nURIs: http://deb.debian.org/debian\nSuites: {suite} {suite}-updates\n\
             Components: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\n\
             Types: deb\nURIs: http://deb.debian.org/debian-security\nSuites: {suite}-security\n\
             Components: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n"
        ),
    )?;
    let local = Path::new("/usr/local/share/ca-certificates");
    if local.is_dir() {
        for entry in fs::read_dir(local)? {
            let path = entry?.path();
            if let Some(file) = path.file_name() {
                fs::copy(
                    &path,
                    rootfs.join("usr/local/share/ca-certificates").join(file),
                )?;
            }
        }
    }
    let bundle = Path::new("/etc/ssl/certs/ca-certificates.crt");
    if bundle.is_file() {
        fs::copy(bundle, rootfs.join("etc/ssl/certs/ca-certificates.crt"))
            .context("cannot copy this machine's CA bundle into the build image")?;
    }
    Ok(())
}

/// The C compiler that builds static programs for `arch` (Debian's and OCI's name) here:
/// this machine's own, or Debian's cross-compiler.
fn c_compiler(arch: &str) -> Result<&'static str> {
    if arch == host_arch() {
        return Ok("gcc");
    }
    match arch {
        "arm64" => Ok(crate::cross::GCC),
        "amd64" => Ok("x86_64-linux-gnu-gcc"),
        other => bail!("no C compiler for {other}"),
    }
}

/// The OCI archive of the kpulse image `name` (see [`KPULSE_IMAGES`]) or of the pause
/// image, as the builder wrote it, and the repository `ctr images import --base-name`
/// needs for it: what the arm64 node imports.
pub fn manifest_archive(workspace: &Path, name: &str) -> Result<(PathBuf, String)> {
    let builder = Builder::new(workspace)?;
    let path = builder.archive_path(name);
    ensure!(
        path.is_file(),
        "{} is missing: cargo xtask cluster build",
        path.display()
    );
    let (repository, _) = repository_and_tag(name)?;
    Ok((path, repository.to_string()))
}

/// This machine's architecture, as Debian and OCI name it.
fn host_arch() -> &'static str {
    crate::vm::Arch::host().debian()
}

/// An image name's repository and tag (the Containerfile's `VERSION`).
fn repository_and_tag(name: &str) -> Result<(&str, &str)> {
    name.rsplit_once(':')
        .filter(|(repository, tag)| !repository.is_empty() && !tag.contains('/'))
        .with_context(|| format!("image name {name} has no tag"))
}

/// The images of a manifest list (`buildah manifest inspect`'s JSON): digest by architecture.
fn manifest_instances(json: &str) -> Result<std::collections::BTreeMap<String, String>> {
    let v: serde_json::Value =
        serde_json::from_str(json).context("buildah manifest inspect printed no JSON")?;
    let manifests = v["manifests"]
        .as_array()
        .context("not a manifest list: no \"manifests\"")?;
    let mut instances = std::collections::BTreeMap::new();
    for m in manifests {
        let arch = m["platform"]["architecture"]
            .as_str()
            .context("a manifest list entry names no architecture")?;
        let digest = m["digest"]
            .as_str()
            .with_context(|| format!("the manifest list's {arch} entry has no digest"))?;
        if let Some(other) = instances.insert(arch.to_string(), digest.to_string()) {
            bail!("the manifest list has two {arch} images: {other} and {digest}");
        }
    }
    Ok(instances)
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

/// Imports image archives into containerd's `k8s.io` namespace.
pub fn import(ctr: &Path, address: &Path, archives: &[Archive]) -> Result<()> {
    for a in archives {
        let mut cmd = Command::new(ctr);
        cmd.arg("--address")
            .arg(address)
            .args(["-n", "k8s.io", "images", "import"]);
        if let Some(base) = &a.base_name {
            cmd.args(["--base-name", base]);
        }
        let out = cmd
            .arg(&a.path)
            .output()
            .with_context(|| format!("cannot run {}", ctr.display()))?;
        if !out.status.success() {
            bail!(
                "ctr images import {} failed: {}",
                a.path.display(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_names_split_at_the_tag() -> Result<()> {
        assert_eq!(
            repository_and_tag("ghcr.io/kpulse/kpulse-agent:0.1.0")?,
            ("ghcr.io/kpulse/kpulse-agent", "0.1.0")
        );
        // A registry's port is not a tag.
        assert!(repository_and_tag("localhost:5000/kpulse-agent").is_err());
        assert!(repository_and_tag("kpulse-agent").is_err());
        assert!(repository_and_tag(":0.1.0").is_err());
        Ok(())
    }

    #[test]
    fn manifest_lists_give_each_architectures_digest() -> Result<()> {
        let json = r#"{"schemaVersion":2,"manifests":[
            {"digest":"sha256:aa","platform":{"architecture":"amd64","os":"linux"}},
            {"digest":"sha256:bb","platform":{"architecture":"arm64","os":"linux"}}]}"#;
        let instances = manifest_instances(json)?;
        assert_eq!(
            instances.get("arm64").map(String::as_str),
            Some("sha256:bb")
        );
        assert_eq!(instances.len(), 2);
        let twice = json.replace("\"amd64\"", "\"arm64\"");
        assert!(manifest_instances(&twice).is_err());
        assert!(manifest_instances(r#"{"manifests":[{"platform":{}}]}"#).is_err());
        assert!(manifest_instances("{}").is_err());
        Ok(())
    }
}
