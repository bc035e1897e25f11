//! Replays the committed fuzz inputs of `fuzz/` through the same bodies cargo-fuzz runs: the
//! minimized corpus (`fuzz/corpus/<target>/`) and every input that once crashed
//! (`fuzz/regressions/<target>/`). See docs/fuzzing.md.

use kpulse_testkit::{fuzz_dir, replay_fuzz_inputs};

#[test]
fn cgroup_path() {
    replay_fuzz_inputs("cgroup_path", kpulse_agent::fuzzing::cgroup_path);
}

/// Writes the seed inputs of `fuzz/corpus/cgroup_path/`: real kubelet layouts (systemd and
/// cgroupfs drivers; containerd, CRI-O, Docker; nested kubelets; runc's colon names) and
/// malformed ones. Run with `cargo test -p kpulse-agent --test fuzz_regressions --
/// --ignored`, then minimize with `cargo xtask fuzz --minimize`.
#[test]
#[ignore = "writes seed files into fuzz/corpus"]
fn write_seeds() {
    const UID: &str = "5f8c0f2a-1b2c-4d3e-9f00-0123456789ab";
    const SUID: &str = "5f8c0f2a_1b2c_4d3e_9f00_0123456789ab";
    const STATIC: &str = "9c8d5d1b1e8e0e8f8d9b5b7e0b3c4a4f";
    const ID: &str = "d4e8e05a546c86b6443f101966c618e47753ed01fa9929cae00d3b692f7a9f80";
    let paths = [
        // systemd driver.
        "/kubepods.slice".to_owned(),
        "/kubepods.slice/kubepods-burstable.slice".to_owned(),
        format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{SUID}.slice"),
        format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{SUID}.slice/cri-containerd-{ID}.scope"),
        format!("/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{SUID}.slice/crio-{ID}.scope"),
        format!("/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{SUID}.slice/crio-{ID}.scope/container"),
        format!("/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{SUID}.slice/crio-conmon-{ID}.scope"),
        format!("/kubepods.slice/kubepods-pod{SUID}.slice/docker-{ID}.scope"),
        format!("/kubepods.slice/kubepods-pod{SUID}.slice/cri-containerd-{ID}.scope/init.scope"),
        format!("/kubepods.slice/kubepods-pod{STATIC}.slice/cri-containerd-{ID}.scope"),
        format!("/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/kubelet-kubepods-burstable-pod{SUID}.slice/cri-containerd-{ID}.scope"),
        format!("/a.slice/a-b.slice/a-b-kubepods.slice/a-b-kubepods-pod{SUID}.slice/{ID}"),
        // cgroupfs driver.
        "/kubepods".to_owned(),
        "/kubepods/besteffort".to_owned(),
        format!("/kubepods/burstable/pod{UID}"),
        format!("/kubepods/burstable/pod{UID}/{ID}"),
        format!("/kubepods/besteffort/pod{UID}/{ID}"),
        format!("/kubepods/pod{UID}/{ID}"),
        format!("/kubepods/pod{UID}/kata_{ID}"),
        format!("/kubepods/burstable/pod{STATIC}/{ID}"),
        format!("/kubepods/kubepods/burstable/pod{UID}/{ID}"),
        // kind / nested kubelet, runc's colon names.
        format!("/system.slice/docker-{ID}.scope/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-pod{SUID}.slice/cri-containerd-{ID}.scope"),
        format!("/kubepods/pod{UID}/{ID}/kubepods/pod{UID}/{ID}"),
        format!("/kubepods-burstable-pod{SUID}.slice:cri-containerd:{ID}"),
        format!("/kubepods-pod{SUID}.slice:cri-containerd:{ID}/sub"),
        format!("/kubepods-besteffort-pod{SUID}.slice:crio:{ID}"),
        format!("/kubepods-pod{SUID}.slice:other:{ID}"),
        // Not Kubernetes.
        "/".to_owned(),
        "/system.slice/containerd.service".to_owned(),
        "/user.slice/user-1000.slice/session-1.scope".to_owned(),
        "./system.slice//crio-conmon.scope/".to_owned(),
        // Malformed.
        "/kubepods/weird".to_owned(),
        "/kubepods/burstable/podnotauid".to_owned(),
        format!("/kubepods.slice/kubepods-burstable.slice/kubepods-besteffort-pod{SUID}.slice"),
        format!("/kubepods/pod{UID}/cri-containerd-{}.scope", ID.to_uppercase()),
        format!("/kubepods-pod{SUID}.slice:docker:nothex"),
        format!("containerd://{ID}"),
        format!("POD{}", UID.to_uppercase()),
    ];
    let dir = fuzz_dir().join("corpus/cgroup_path");
    std::fs::create_dir_all(&dir).expect("mkdir");
    for (i, path) in paths.iter().enumerate() {
        std::fs::write(dir.join(format!("seed-{i:02}")), path).expect("write seed");
    }
}
