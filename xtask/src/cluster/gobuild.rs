//! Building the cluster's Go components from their published modules.
//!
//! `go install module@version` refuses modules with `replace` directives (Kubernetes and
//! etcd have them), so each component gets a small wrapper module in
//! `target/cluster/build/<name>-<version>/`: it requires the pinned module, adds the
//! `replace` lines the published module cannot carry (Kubernetes' staging modules, each at
//! its published `v0.<minor>.<patch>`), copies the `go` and `godebug` lines of the module it
//! wraps, and lists the commands as `tool` directives. `go mod tidy` completes it, and
//! `go build` writes the binaries into its `bin/`. Go's module cache (`GOMODCACHE`) and build
//! cache (`GOCACHE`) are Go's own defaults, shared by every run; a component whose wrapper
//! and binaries are already there is not rebuilt.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{bail, ensure, Context, Result};

use super::versions::{self, Release};

/// How to build one component.
#[derive(Debug, Clone)]
pub struct Component {
    /// Short name: the wrapper's directory is `<name>-<version>`.
    pub name: &'static str,
    /// The module the wrapper requires.
    pub module: &'static str,
    /// Its version, without the `v`.
    pub version: &'static str,
    /// Packages (main) to build; each becomes `bin/<last path element>`.
    pub commands: Vec<String>,
    /// Build tags.
    pub tags: &'static str,
    /// `-X` flags for the linker (`pkg.var=value`).
    pub ldflags_x: Vec<String>,
    /// Replace Kubernetes' staging modules by their published versions.
    pub kubernetes_staging: bool,
    /// Binaries renamed after the build (`server` → `etcd`).
    pub renames: &'static [(&'static str, &'static str)],
    /// Built with cgo (runc: its `nsenter` is C, and seccomp needs libseccomp).
    pub cgo: bool,
    /// A `main.go` of the wrapper module itself, built as [`Component::own_main`] instead
    /// of a command of the wrapped module (CoreDNS with a chosen plugin list).
    pub main_go: Option<&'static str>,
    /// Built for another architecture than this machine's (`GOARCH`, Go's and Debian's
    /// name): the wrapper's directory is `<name>-<version>-<arch>`. With cgo, the C parts
    /// are built by [`Cross::cc`] and the binary is linked statically against
    /// [`Cross::sysroot`]'s libraries (found by pkg-config), as upstream's static release
    /// builds are (a guest of another architecture has no C library for it).
    pub cross: Option<Cross>,
}

/// Another architecture's build of a component (see [`Component::cross`]).
#[derive(Debug, Clone)]
pub struct Cross {
    /// `GOARCH`.
    pub goarch: &'static str,
    /// The C cross-compiler (cgo only).
    pub cc: &'static str,
    /// The root of that architecture's unpacked `-dev` packages (cgo only): pkg-config's
    /// sysroot, its `.pc` files under `usr/lib/<triplet>/pkgconfig`.
    pub sysroot: Option<PathBuf>,
    /// The triplet of the sysroot's library directory (`aarch64-linux-gnu`).
    pub triplet: &'static str,
}

impl Component {
    /// A pure-Go build of `commands` of `module` at `version`, with build tags `tags` and
    /// nothing else set.
    pub fn plain(
        name: &'static str,
        module: &'static str,
        version: &'static str,
        commands: &[&str],
        tags: &'static str,
    ) -> Component {
        Component {
            name,
            module,
            version,
            commands: commands.iter().map(|c| (*c).to_string()).collect(),
            tags,
            ldflags_x: Vec::new(),
            kubernetes_staging: false,
            renames: &[],
            cgo: false,
            main_go: None,
            cross: None,
        }
    }

    /// Where the wrapper module and `bin/` live.
    pub fn dir(&self, build_root: &Path) -> PathBuf {
        match &self.cross {
            None => build_root.join(format!("{}-{}", self.name, self.version)),
            Some(c) => build_root.join(format!("{}-{}-{}", self.name, self.version, c.goarch)),
        }
    }

    /// The binary `name` (a command's last path element, or a rename's new name).
    pub fn bin(&self, build_root: &Path, name: &str) -> PathBuf {
        self.dir(build_root).join("bin").join(name)
    }

    /// The import path of the wrapper module, which is the package of its own `main.go`.
    pub fn own_main(&self) -> String {
        format!("kpulse.local/cluster/{}", self.name)
    }

    /// The packages `go build` builds: the wrapped module's commands, and the wrapper's own
    /// main when it has one.
    pub fn packages(&self) -> Vec<String> {
        let mut p = self.commands.clone();
        if self.main_go.is_some() {
            p.push(self.own_main());
        }
        p
    }

    /// `-tags`: the component's, and for a static cgo build glibc-free user and host
    /// lookups (`osusergo`, `netgo`: a static glibc cannot load its NSS modules).
    pub fn build_tags(&self) -> String {
        let mut tags = self.tags.to_string();
        if self.cgo && self.cross.is_some() {
            // Go splits on commas if there are any, else on spaces.
            let sep = if tags.contains(',') { ',' } else { ' ' };
            for t in ["netgo", "osusergo"] {
                if !tags.is_empty() {
                    tags.push(sep);
                }
                tags.push_str(t);
            }
        }
        tags
    }

    /// The names of the binaries in `bin/`.
    pub fn binaries(&self) -> Vec<String> {
        self.packages()
            .iter()
            .map(|c| {
                let built = command_name(c);
                self.renames
                    .iter()
                    .find(|(from, _)| *from == built)
                    .map_or(built, |(_, to)| *to)
                    .to_string()
            })
            .collect()
    }
}

/// The Kubernetes binaries of `release` (the control plane, kubelet, kube-proxy, kubectl).
pub fn kubernetes(release: &Release) -> Component {
    let v = release.kubernetes;
    let minor = release.minor().trim_start_matches("1.");
    let mut ldflags_x = Vec::new();
    for pkg in [
        "k8s.io/component-base/version",
        "k8s.io/client-go/pkg/version",
    ] {
        for (key, value) in [
            ("gitVersion", format!("v{v}")),
            ("gitMajor", "1".to_string()),
            ("gitMinor", minor.to_string()),
            ("gitTreeState", "clean".to_string()),
            ("buildDate", "1970-01-01T00:00:00Z".to_string()),
        ] {
            ldflags_x.push(format!("{pkg}.{key}={value}"));
        }
    }
    Component {
        name: "kubernetes",
        module: "k8s.io/kubernetes",
        version: v,
        commands: [
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
            "kubelet",
            "kube-proxy",
            "kubectl",
        ]
        .iter()
        .map(|c| format!("k8s.io/kubernetes/cmd/{c}"))
        .collect(),
        // Upstream's tags for release binaries.
        tags: "selinux,notest,grpcnotrace",
        ldflags_x,
        kubernetes_staging: true,
        renames: &[],
        cgo: false,
        main_go: None,
        cross: None,
    }
}

/// The other components: etcd and containerd of `release`, CNI plugins, CoreDNS, crictl,
/// metrics-server.
pub fn node_components(release: &Release) -> Vec<Component> {
    let plain = Component::plain;
    vec![
        // server/v3's root package is etcd's main.
        Component {
            renames: &[("server", "etcd")],
            ..plain(
                "etcd",
                "go.etcd.io/etcd/server/v3",
                release.etcd,
                &["go.etcd.io/etcd/server/v3"],
                "",
            )
        },
        Component {
            // What `containerd --version` and the node's containerRuntimeVersion report.
            ldflags_x: vec![format!(
                "github.com/containerd/containerd/v2/version.Version=v{}",
                release.containerd
            )],
            ..plain(
                "containerd",
                "github.com/containerd/containerd/v2",
                release.containerd,
                &[
                    "github.com/containerd/containerd/v2/cmd/containerd",
                    "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2",
                    "github.com/containerd/containerd/v2/cmd/ctr",
                ],
                // Snapshotters that need C libraries, left out as in containerd's static builds.
                "no_btrfs,no_devmapper,no_zfs",
            )
        },
        Component {
            cgo: true,
            ..plain(
                "runc",
                "github.com/opencontainers/runc",
                release.runc,
                &["github.com/opencontainers/runc"],
                // runc's Makefile default.
                "seccomp urfave_cli_no_docs",
            )
        },
        plain(
            "crictl",
            "sigs.k8s.io/cri-tools",
            versions::CRI_TOOLS,
            &["sigs.k8s.io/cri-tools/cmd/crictl"],
            "",
        ),
        plain(
            "cni-plugins",
            "github.com/containernetworking/plugins",
            versions::CNI_PLUGINS,
            &[
                "github.com/containernetworking/plugins/plugins/main/bridge",
                "github.com/containernetworking/plugins/plugins/main/loopback",
                "github.com/containernetworking/plugins/plugins/ipam/host-local",
                "github.com/containernetworking/plugins/plugins/meta/portmap",
            ],
            "",
        ),
        Component {
            main_go: Some(include_str!("coredns_main.go")),
            ..plain(
                "coredns",
                "github.com/coredns/coredns",
                versions::COREDNS,
                &[],
                "",
            )
        },
        plain(
            "metrics-server",
            "sigs.k8s.io/metrics-server",
            versions::METRICS_SERVER,
            &["sigs.k8s.io/metrics-server/cmd/metrics-server"],
            "",
        ),
    ]
}

/// kwok (`cluster fleet`, and the cluster checks' small fleet): built with the cluster's
/// components, run only when a fleet is made. Its releases set
/// nothing through ldflags that the tag does not already say (`consts.Version`).
pub fn kwok() -> Component {
    Component::plain(
        "kwok",
        "sigs.k8s.io/kwok",
        versions::KWOK,
        &["sigs.k8s.io/kwok/cmd/kwok"],
        "",
    )
}

/// The `go` command: on PATH, or where the Go distribution installs it.
pub fn go_command() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|d| d.join("go"))
            .find(|p| p.is_file())
    }) {
        return Ok(p);
    }
    let fallback = PathBuf::from("/usr/local/go/bin/go");
    ensure!(
        fallback.is_file(),
        "the go command is not installed (not on PATH, not at /usr/local/go/bin/go)"
    );
    Ok(fallback)
}

/// A `go` command with the environment every build uses: no cgo (static binaries) unless
/// asked, no toolchain download (a module that needs a newer Go fails, naming the version),
/// and module mode.
pub(crate) fn go(go: &Path, dir: &Path) -> Command {
    let mut cmd = Command::new(go);
    cmd.current_dir(dir)
        .env("CGO_ENABLED", "0")
        .env("GOTOOLCHAIN", "local")
        .env("GOFLAGS", "-mod=mod -buildvcs=false")
        .env_remove("GOPATH_OVERRIDE");
    cmd
}

/// `go mod download -json module@version`: where the module cache has it.
fn download(go_bin: &Path, dir: &Path, module: &str, version: &str) -> Result<serde_json::Value> {
    let out = crate::exec::output(go(go_bin, dir).args([
        "mod",
        "download",
        "-json",
        &format!("{module}@v{version}"),
    ]))?;
    serde_json::from_str(&out).context("go mod download -json printed no JSON")
}

/// One string field of a `go mod download -json` answer.
fn field<'a>(info: &'a serde_json::Value, name: &str, module: &str) -> Result<&'a str> {
    info.get(name)
        .and_then(|v| v.as_str())
        .with_context(|| format!("go mod download {module}: no {name} in {info}"))
}

/// The `go.mod` of the module `module@version`, from the module cache (downloading it).
fn module_go_mod(go_bin: &Path, dir: &Path, module: &str, version: &str) -> Result<String> {
    let info = download(go_bin, dir, module, version)?;
    let path = field(&info, "GoMod", module)?;
    fs::read_to_string(path).with_context(|| format!("cannot read {path}"))
}

/// The directory of `module@version` in Go's module cache (downloading it).
pub fn module_dir(module: &str, version: &str) -> Result<PathBuf> {
    let info = download(&go_command()?, &std::env::temp_dir(), module, version)?;
    Ok(PathBuf::from(field(&info, "Dir", module)?))
}

/// The wrapper's `go.mod`, before `go mod tidy`.
pub fn wrapper_go_mod(component: &Component, wrapped: &str) -> Result<String> {
    let mut go_line = None;
    let mut godebug = Vec::new();
    let mut staging = Vec::new();
    for line in wrapped.lines() {
        let t = line.trim();
        if let Some(v) = t.strip_prefix("go ") {
            go_line = Some(v.trim().to_string());
        } else if t.starts_with("godebug ") {
            godebug.push(t.to_string());
        } else if component.kubernetes_staging {
            // `k8s.io/api => ./staging/src/k8s.io/api`, inside a `replace (` block.
            if let Some((from, to)) = t.split_once("=>") {
                if to.trim().starts_with("./staging/") {
                    staging.push(from.trim().to_string());
                }
            }
        }
    }
    let go_line = go_line.context("the wrapped go.mod has no go line")?;
    let mut s = format!(
        "// Generated by `cargo xtask cluster`: builds {}@v{} (xtask/src/cluster/versions.rs).\n\
         module {}\n\ngo {go_line}\n",
        component.module,
        component.version,
        component.own_main()
    );
    for g in &godebug {
        s.push_str(&format!("\n{g}\n"));
    }
    s.push_str(&format!(
        "\nrequire {} v{}\n",
        component.module, component.version
    ));
    if component.kubernetes_staging {
        ensure!(
            !staging.is_empty(),
            "{}@v{}: no `=> ./staging/` replace lines in its go.mod",
            component.module,
            component.version
        );
        let published = format!(
            "v0.{}",
            component
                .version
                .strip_prefix("1.")
                .context("Kubernetes versions start with 1.")?
        );
        s.push_str("\nreplace (\n");
        for m in &staging {
            s.push_str(&format!("\t{m} => {m} {published}\n"));
        }
        s.push_str(")\n");
    }
    // The wrapper's own main.go needs no directive: its imports are the module's packages.
    if !component.commands.is_empty() {
        s.push_str("\ntool (\n");
        for c in &component.commands {
            s.push_str(&format!("\t{c}\n"));
        }
        s.push_str(")\n");
    }
    Ok(s)
}

/// The compiler's flags for every package. The binaries are stripped (`-ldflags=-s -w`), so
/// the DWARF the compiler would write is dropped at link time anyway; not writing it saves
/// about an eighth of the compile CPU (etcd 3.7.3 from a cold build cache: 139 → 122 CPU
/// seconds; see docs/design/toolchain.md, "The machine of 2026-12-02").
const GCFLAGS: &str = "all=-dwarf=false";

/// Builds `component` into its `bin/` unless the same wrapper was already built there.
/// Prints progress.
pub fn build(component: &Component, build_root: &Path) -> Result<()> {
    let dir = component.dir(build_root);
    let bin = dir.join("bin");
    fs::create_dir_all(&bin).with_context(|| format!("cannot create {}", bin.display()))?;
    let go_bin = go_command()?;
    let label = format!("{} {}", component.name, component.version);
    let wrapped = module_go_mod(&go_bin, &dir, component.module, component.version)?;
    let generated = wrapper_go_mod(component, &wrapped)?;
    let tags = component.build_tags();
    let stamp_text = format!(
        "{generated}\n# tags: {tags}\n# gcflags: {GCFLAGS}\n# ldflags: {}\n# cgo: {}\n# cross: {:?}\n\
         # main.go:\n{}",
        component.ldflags_x.join(" "),
        component.cgo,
        component.cross,
        component.main_go.unwrap_or("")
    );
    let stamp = dir.join("built.stamp");
    let all_built = component.binaries().iter().all(|b| bin.join(b).is_file());
    if all_built && fs::read_to_string(&stamp).ok().as_deref() == Some(stamp_text.as_str()) {
        println!("cluster: {label}: built already ({})", bin.display());
        return Ok(());
    }
    let _ = fs::remove_file(&stamp);
    fs::write(dir.join("go.mod"), &generated)
        .with_context(|| format!("cannot write {}", dir.join("go.mod").display()))?;
    if let Some(text) = component.main_go {
        let main_go = dir.join("main.go");
        fs::write(&main_go, text).with_context(|| format!("cannot write {}", main_go.display()))?;
    }
    let started = Instant::now();
    println!(
        "cluster: {label}: resolving modules (go mod tidy in {})",
        dir.display()
    );
    crate::exec::run(go(&go_bin, &dir).args(["mod", "tidy"]))?;
    println!(
        "cluster: {label}: building {} (cold: minutes; Go's build cache makes later builds fast)",
        component.binaries().join(", ")
    );
    let mut ldflags = String::from("-s -w");
    for x in &component.ldflags_x {
        ldflags.push_str(" -X ");
        ldflags.push_str(x);
    }
    let mut cmd = go(&go_bin, &dir);
    if component.cgo {
        cmd.env("CGO_ENABLED", "1");
    }
    if let Some(cross) = &component.cross {
        cmd.env("GOARCH", cross.goarch);
        if component.cgo {
            let sysroot = cross
                .sysroot
                .as_ref()
                .with_context(|| format!("{label}: cgo for {} needs a sysroot", cross.goarch))?;
            let libdir = sysroot.join("usr/lib").join(cross.triplet);
            // Go's build cache keys a cgo package on CGO_CFLAGS and CGO_LDFLAGS but not on
            // what pkg-config printed, so a package compiled against another checkout's
            // sysroot would come back from the cache with that checkout's `-L` path (CI
            // failed so: `cannot find -lseccomp` under a path that no longer existed).
            // Naming the sysroot in both puts it in the cache key; Go's own default for
            // both is `-O2 -g`.
            cmd.env("CC", cross.cc)
                .env(
                    "CGO_CFLAGS",
                    format!("-O2 -g -I{}", sysroot.join("usr/include").display()),
                )
                .env("CGO_LDFLAGS", format!("-O2 -g -L{}", libdir.display()))
                .env("PKG_CONFIG_LIBDIR", libdir.join("pkgconfig"))
                .env("PKG_CONFIG_SYSROOT_DIR", sysroot);
            ldflags.push_str(" -linkmode external -extldflags -static");
        }
    }
    cmd.args(["build", "-trimpath"]);
    if !tags.is_empty() {
        cmd.args(["-tags", &tags]);
    }
    cmd.args(["-gcflags", GCFLAGS, "-ldflags", &ldflags, "-o"])
        .arg(format!("{}/", bin.display()))
        .args(component.packages());
    crate::exec::run(&mut cmd)?;
    for (from, to) in component.renames {
        fs::rename(bin.join(from), bin.join(to))
            .with_context(|| format!("cannot rename {from} to {to} in {}", bin.display()))?;
    }
    for name in component.binaries() {
        let b = bin.join(&name);
        if !b.is_file() {
            bail!("go build succeeded but {} is missing", b.display());
        }
    }
    fs::write(&stamp, stamp_text).with_context(|| format!("cannot write {}", stamp.display()))?;
    println!(
        "cluster: {label}: built in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The binary `go build` makes of `pkg`: its last path element, or the one before a
/// major-version suffix (`server` of `go.etcd.io/etcd/server/v3`).
pub fn command_name(pkg: &str) -> &str {
    let mut parts = pkg.rsplit('/');
    let last = parts.next().unwrap_or(pkg);
    // Go names a binary after the path element before a major-version suffix.
    if last.len() > 1 && last.starts_with('v') && last[1..].chars().all(|c| c.is_ascii_digit()) {
        parts.next().unwrap_or(last)
    } else {
        last
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KUBE_GO_MOD: &str = "module k8s.io/kubernetes\n\ngo 1.26.0\n\ngodebug default=go1.26\n\n\
        require (\n\tk8s.io/api v0.0.0\n)\n\nreplace (\n\tk8s.io/api => ./staging/src/k8s.io/api\n\
        \tk8s.io/client-go => ./staging/src/k8s.io/client-go\n)\n";

    #[test]
    fn kubernetes_wrapper_replaces_staging_with_published_versions() {
        let c = kubernetes(&versions::RELEASES[0]);
        let m = wrapper_go_mod(&c, KUBE_GO_MOD).expect("test setup");
        assert!(m.contains("\ngo 1.26.0\n"), "{m}");
        assert!(m.contains("\ngodebug default=go1.26\n"), "{m}");
        assert!(m.contains("require k8s.io/kubernetes v1.37.2\n"), "{m}");
        assert!(m.contains("\tk8s.io/api => k8s.io/api v0.37.2\n"), "{m}");
        assert!(
            m.contains("\tk8s.io/client-go => k8s.io/client-go v0.37.2\n"),
            "{m}"
        );
        assert!(m.contains("\tk8s.io/kubernetes/cmd/kubelet\n"), "{m}");
    }

    #[test]
    fn a_kubernetes_go_mod_without_staging_is_an_error() {
        let c = kubernetes(&versions::RELEASES[0]);
        let err = wrapper_go_mod(&c, "module x\n\ngo 1.26.0\n").expect_err("an error");
        assert!(err.to_string().contains("staging"), "{err}");
    }

    #[test]
    fn coredns_is_its_own_main_with_no_tool_directive() {
        let c = node_components(&versions::RELEASES[0])
            .into_iter()
            .find(|c| c.name == "coredns")
            .expect("a coredns component");
        assert_eq!(c.binaries(), ["coredns"]);
        assert_eq!(c.packages(), ["kpulse.local/cluster/coredns"]);
        let m = wrapper_go_mod(&c, "module github.com/coredns/coredns\n\ngo 1.25.0\n")
            .expect("test setup");
        assert!(m.contains("module kpulse.local/cluster/coredns\n"), "{m}");
        assert!(
            m.contains("require github.com/coredns/coredns v1.15.0\n"),
            "{m}"
        );
        assert!(!m.contains("tool"), "{m}");
    }

    /// Every directive of the cluster's Corefile has its plugin in the CoreDNS main, and
    /// the main has no plugin the Corefile does not use.
    #[test]
    fn coredns_main_has_the_plugins_of_the_corefile() {
        let manifest = include_str!("coredns.yaml");
        let corefile = manifest
            .split_once("Corefile: |")
            .and_then(|(_, rest)| rest.split_once("\n---"))
            .map(|(c, _)| c)
            .expect("coredns.yaml has a Corefile");
        let mut directives: Vec<&str> = corefile
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('.') && !l.starts_with('}'))
            .filter(|l| {
                // The kubernetes block's own options are not directives.
                !["pods ", "fallthrough ", "ttl "]
                    .iter()
                    .any(|o| l.starts_with(o))
            })
            .filter_map(|l| l.split_whitespace().next())
            .collect();
        directives.sort_unstable();
        // Each plugin's directory, as plugin.cfg maps a directive to it.
        let mut plugins: Vec<&str> = directives
            .iter()
            .map(|d| if *d == "prometheus" { "metrics" } else { *d })
            .collect();
        plugins.sort_unstable();
        let main = include_str!("coredns_main.go");
        let mut imported: Vec<&str> = main
            .lines()
            .filter_map(|l| {
                l.trim()
                    .strip_prefix("_ \"github.com/coredns/coredns/plugin/")
            })
            .filter_map(|l| l.strip_suffix('"'))
            .collect();
        imported.sort_unstable();
        assert_eq!(plugins.len(), 9, "{directives:?}");
        assert_eq!(imported, plugins);
    }

    #[test]
    fn binary_names_follow_go_build() {
        assert_eq!(command_name("k8s.io/kubernetes/cmd/kubelet"), "kubelet");
        assert_eq!(command_name("go.etcd.io/etcd/server/v3"), "server");
        assert_eq!(command_name("github.com/coredns/coredns"), "coredns");
    }

    /// Another architecture's build has its own directory; a static cgo build gets Go's
    /// own user and host lookups, in the separator the component's tags use.
    #[test]
    fn cross_builds_live_apart_and_static_cgo_adds_go_lookups() {
        let components = node_components(&versions::RELEASES[0]);
        let find = |name: &str| {
            components
                .iter()
                .find(|c| c.name == name)
                .cloned()
                .expect("a component")
        };
        let root = Path::new("/b");
        let mut runc = find("runc");
        assert_eq!(runc.build_tags(), "seccomp urfave_cli_no_docs");
        let native = runc.dir(root);
        runc.cross = Some(Cross {
            goarch: "arm64",
            cc: "aarch64-linux-gnu-gcc",
            sysroot: Some(PathBuf::from("/s")),
            triplet: "aarch64-linux-gnu",
        });
        assert_ne!(runc.dir(root), native);
        assert!(
            runc.dir(root).ends_with("runc-1.5.2-arm64"),
            "{:?}",
            runc.dir(root)
        );
        assert_eq!(
            runc.build_tags(),
            "seccomp urfave_cli_no_docs netgo osusergo"
        );
        // Pure Go: the tags stay as they are.
        let mut containerd = find("containerd");
        containerd.cross = runc.cross.clone();
        assert_eq!(containerd.build_tags(), "no_btrfs,no_devmapper,no_zfs");
        containerd.cgo = true;
        assert_eq!(
            containerd.build_tags(),
            "no_btrfs,no_devmapper,no_zfs,netgo,osusergo"
        );
    }
}
