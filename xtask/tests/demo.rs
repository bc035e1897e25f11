//! `cargo xtask demo` end to end, as root: the real binaries, cgroups and kubectl. While it
//! runs, `kubectl top pod -n demo` through the kubeconfig it wrote shows `web` at about half
//! a core and `cache` at 200 MiB; when it ends (at `--duration`, or on SIGINT) no cgroup and
//! no process it started remains.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .expect("status")
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|v| v.split_whitespace().nth(1).map(|u| u == "0"))
        .unwrap_or(false)
}

fn start_demo(args: &[&str], out: &Path) -> Child {
    let log = std::fs::File::create(out).expect("demo output file");
    Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(["demo", "--no-build", "--no-clear"])
        .args(args)
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("dup"))
        .stderr(log)
        .spawn()
        .expect("start xtask demo")
}

/// `(pod, millicores, MiB)` from `kubectl top pod -n demo`, once both pods are there.
fn top(kubeconfig: &Path) -> Option<Vec<(String, u64, u64)>> {
    let out = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["top", "pod", "-n", "demo", "--no-headers"])
        .output()
        .ok()?;
    let rows: Vec<(String, u64, u64)> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Some((
                f.first()?.to_string(),
                f.get(1)?.strip_suffix('m')?.parse().ok()?,
                f.get(2)?.strip_suffix("Mi")?.parse().ok()?,
            ))
        })
        .collect();
    (rows.len() == 2).then_some(rows)
}

fn wait_exit(child: &mut Child, within: Duration, output: &Path) {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            let text = std::fs::read_to_string(output).unwrap_or_default();
            assert!(status.success(), "xtask demo failed: {status}\n{text}");
            assert!(text.contains("kpulse demo: "), "no summary:\n{text}");
            return;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("xtask demo did not end within {within:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Nothing left: no `kpulse-demo` cgroup in any hierarchy, no process in one, no process
/// running with the demo's files.
fn assert_clean(demo_dir: &Path) {
    let mut mounts = vec![PathBuf::from("/sys/fs/cgroup")];
    if let Ok(entries) = std::fs::read_dir("/sys/fs/cgroup") {
        mounts.extend(entries.flatten().map(|e| e.path()));
    }
    for m in mounts {
        let p = m.join("kpulse-demo");
        assert!(!p.exists(), "{} remains", p.display());
    }
    let me = std::process::id().to_string();
    let needle = demo_dir.display().to_string();
    for e in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.bytes().all(|b| b.is_ascii_digit()) || name == me {
            continue;
        }
        let cgroup = std::fs::read_to_string(e.path().join("cgroup")).unwrap_or_default();
        assert!(
            !cgroup.contains("kpulse-demo"),
            "process {name} in {cgroup}"
        );
        let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        assert!(
            !cmdline.contains(&needle),
            "process {name} remains: {cmdline}"
        );
    }
}

#[test]
fn demo_shows_the_pods_and_leaves_nothing_behind() {
    if !is_root() {
        assert!(
            std::env::var("CI").is_err(),
            "the demo test needs root in CI"
        );
        println!("SKIPPED: needs root (creates cgroups, loads eBPF)");
        return;
    }
    let root = root();
    // The binaries the demo starts (`--no-build` skips the eBPF build: the agent falls
    // back to cgroupfs if no object was embedded).
    let status = Command::new(env!("CARGO"))
        .current_dir(&root)
        .args(["build", "-p", "kpulse-agent", "-p", "kpulse-aggregator-api"])
        .status()
        .expect("cargo build");
    assert!(status.success(), "cargo build failed");
    let demo_dir = root.join("target/demo");
    let kubeconfig = demo_dir.join("kubeconfig");
    let out = std::env::temp_dir().join(format!("kpulse-demo-test-{}.out", std::process::id()));

    // Until --duration: the numbers, ~4 s after they first appear.
    let _ = std::fs::remove_file(&kubeconfig);
    let mut demo = start_demo(&["--duration", "12s"], &out);
    let deadline = Instant::now() + Duration::from_secs(30);
    while top(&kubeconfig).is_none() {
        assert!(
            Instant::now() < deadline,
            "no metrics within 30 s:\n{}",
            std::fs::read_to_string(&out).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    std::thread::sleep(Duration::from_secs(4));
    let rows = top(&kubeconfig).expect("both pods");
    for (pod, milli, mib) in &rows {
        match pod.as_str() {
            "web" => assert!((400..=600).contains(milli), "web at {milli}m: {rows:?}"),
            "cache" => assert!(*mib >= 190, "cache at {mib}Mi: {rows:?}"),
            other => panic!("unexpected pod {other}"),
        }
    }
    wait_exit(&mut demo, Duration::from_secs(30), &out);
    assert_clean(&demo_dir);

    // Ctrl-C: the same cleanup.
    let _ = std::fs::remove_file(&kubeconfig);
    let mut demo = start_demo(&[], &out);
    let deadline = Instant::now() + Duration::from_secs(30);
    while top(&kubeconfig).is_none() {
        assert!(Instant::now() < deadline, "no metrics within 30 s");
        std::thread::sleep(Duration::from_millis(250));
    }
    let sent = Command::new("kill")
        .args(["-INT", &demo.id().to_string()])
        .status()
        .expect("kill");
    assert!(sent.success());
    wait_exit(&mut demo, Duration::from_secs(30), &out);
    let text = std::fs::read_to_string(&out).unwrap_or_default();
    assert!(text.contains("kpulse demo: interrupted"), "{text}");
    assert_clean(&demo_dir);
    let _ = std::fs::remove_file(&out);
}
