//! A swap area for tests that need the node to have swap: the node's own when it has one,
//! otherwise one the test adds and removes on drop. On a host, a file under `/var/tmp`; in
//! the VM stage, whose root is an initramfs that cannot hold a swap file, a RAM disk of the
//! kernel's `brd` module, which the stage ships at `$KPULSE_SWAP_MODULE`.

use std::{path::PathBuf, process::Command};

/// Name prefix of the swap files tests add (the leftover checks look for it).
pub const FILE_PREFIX: &str = "kpulse-swap-";

/// The swap area; removes what it added on drop.
pub struct Swap {
    added: Option<Added>,
}

enum Added {
    File(PathBuf),
    RamDisk,
}

const RAM_DISK: &str = "/dev/ram0";

fn run(program: &str, args: &[&str]) -> Result<(), String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| format!("cannot run {program}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{program} {} failed: {}: {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// `key` (`SwapTotal`, …) of `/proc/meminfo`, kB, read here rather than by the agent's own
/// parser, which the tests check.
pub fn meminfo_kb(key: &str) -> u64 {
    let text = std::fs::read_to_string("/proc/meminfo").expect("read /proc/meminfo");
    text.lines()
        .find_map(|l| {
            l.strip_prefix(key)?
                .strip_prefix(':')?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("/proc/meminfo has no {key}"))
}

/// `SwapTotal` of `/proc/meminfo`, kB.
pub fn swap_total_kb() -> u64 {
    meminfo_kb("SwapTotal")
}

/// `SwapTotal - SwapFree` of `/proc/meminfo`, bytes.
pub fn swap_used() -> u64 {
    swap_total_kb().saturating_sub(meminfo_kb("SwapFree")) * 1024
}

impl Swap {
    /// Makes sure the node has swap: `mib` MiB of it when this adds the area.
    pub fn ensure(mib: u64) -> Result<Swap, String> {
        if swap_total_kb() > 0 {
            return Ok(Swap { added: None });
        }
        if let Some(module) = std::env::var_os("KPULSE_SWAP_MODULE") {
            let module = module.to_string_lossy().into_owned();
            let size = format!("rd_size={}", mib * 1024);
            run("insmod", &[&module, "rd_nr=1", &size])?;
            let swap = Swap {
                added: Some(Added::RamDisk),
            };
            write_swap_header(RAM_DISK, mib)?;
            run("swapon", &[RAM_DISK])?;
            return Ok(swap);
        }
        let file = PathBuf::from("/var/tmp").join(format!("{FILE_PREFIX}{}", std::process::id()));
        let path = file.to_string_lossy().into_owned();
        let swap = Swap {
            added: Some(Added::File(file)),
        };
        // Written, not fallocated: every file system takes a file without holes.
        run(
            "dd",
            &[
                "if=/dev/zero",
                &format!("of={path}"),
                "bs=1M",
                &format!("count={mib}"),
                "status=none",
            ],
        )?;
        run("chmod", &["600", &path])?;
        run("mkswap", &[&path])?;
        run("swapon", &[&path])?;
        Ok(swap)
    }
}

/// Writes the kernel's swap header (`union swap_header` of `include/linux/swap.h`, version 1)
/// to `device`, as `mkswap` does. The VMs cannot run busybox's `mkswap`: it reads
/// `/dev/urandom` for a UUID, and right after boot, before the kernel's random pool is ready,
/// that read runs the kernel's jitter entropy generator, which crashed the 6.12 guest under
/// qemu's TCG (an `int3` oops in `sched_clock_cpu`). The UUID is optional; this leaves it 0.
fn write_swap_header(device: &str, mib: u64) -> Result<(), String> {
    use std::io::Write;
    // SAFETY: sysconf has no preconditions.
    #[allow(unsafe_code)]
    let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) })
        .map_err(|_| "no page size".to_string())?;
    let pages = u32::try_from((mib << 20) / page as u64).map_err(|_| "too large".to_string())?;
    let mut header = vec![0u8; page];
    // After 1,024 boot bytes: version, last page, bad pages; the magic ends the page.
    header[1024..1028].copy_from_slice(&1u32.to_ne_bytes());
    header[1028..1032].copy_from_slice(&(pages - 1).to_ne_bytes());
    header[page - 10..].copy_from_slice(b"SWAPSPACE2");
    std::fs::OpenOptions::new()
        .write(true)
        .open(device)
        .and_then(|mut f| f.write_all(&header).and_then(|()| f.sync_all()))
        .map_err(|e| format!("cannot write a swap header to {device}: {e}"))
}

impl Drop for Swap {
    fn drop(&mut self) {
        match self.added.take() {
            None => {}
            Some(Added::File(file)) => {
                let path = file.to_string_lossy().into_owned();
                if let Err(e) = run("swapoff", &[&path]) {
                    eprintln!("swap: {e}");
                }
                if let Err(e) = std::fs::remove_file(&file) {
                    eprintln!("swap: cannot remove {path}: {e}");
                }
            }
            Some(Added::RamDisk) => {
                if let Err(e) = run("swapoff", &[RAM_DISK]) {
                    eprintln!("swap: {e}");
                }
                if let Err(e) = run("rmmod", &["brd"]) {
                    eprintln!("swap: {e}");
                }
            }
        }
    }
}

/// Swap areas a test added and left behind (lines of `/proc/swaps`).
pub fn leftovers() -> Vec<String> {
    std::fs::read_to_string("/proc/swaps")
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(FILE_PREFIX))
        .map(str::to_owned)
        .collect()
}
