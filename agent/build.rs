//! Embeds the eBPF object built by `cargo xtask build-ebpf`, when there is one.
//!
//! Without it the agent still builds (and its cgroupfs collector works); asking for the
//! eBPF collector then fails with a message naming `cargo xtask build-ebpf`.

use std::path::PathBuf;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(kpulse_embedded_ebpf)");
    println!("cargo::rerun-if-env-changed=KPULSE_EBPF_OBJECT");
    let object = match std::env::var_os("KPULSE_EBPF_OBJECT") {
        Some(p) => PathBuf::from(p),
        None => {
            let manifest =
                PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
            let dir = manifest.join("../target/ebpf");
            // Watch the directory so that a first build of the object is noticed.
            let _ = std::fs::create_dir_all(&dir);
            println!("cargo::rerun-if-changed={}", dir.display());
            dir.join("kpulse.bpf.o")
        }
    };
    if object.is_file() {
        println!("cargo::rerun-if-changed={}", object.display());
        println!("cargo::rustc-cfg=kpulse_embedded_ebpf");
        println!(
            "cargo::rustc-env=KPULSE_EBPF_OBJECT_PATH={}",
            object.display()
        );
    }
}
