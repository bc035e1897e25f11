//! Workloads run by the test executables themselves (`<test> workload <kind> ...`), placed
//! in their cgroups by writing their own pid to the `cgroup.procs` files given last.

use std::{
    io::Write,
    time::{Duration, Instant},
};

/// If this process was started as a workload, runs it and returns true (the caller then
/// returns from `main`).
pub fn dispatch() -> bool {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) != Some("workload") {
        return false;
    }
    run(&args[2..]);
    true
}

fn join(files: &[String]) {
    for f in files {
        std::fs::write(f, "0").unwrap_or_else(|e| panic!("join {f}: {e}"));
    }
}

fn ready() {
    println!("ready");
    let _ = std::io::stdout().flush();
}

fn run(args: &[String]) {
    let kind = args.first().map(String::as_str).unwrap_or("");
    match kind {
        // `spin <procs...>`: one busy thread, forever.
        "spin" => {
            join(&args[1..]);
            ready();
            loop {
                std::hint::spin_loop();
            }
        }
        // `duty <procs...>`: busy half of every 20 ms, forever.
        "duty" => {
            join(&args[1..]);
            ready();
            loop {
                let t = Instant::now();
                while t.elapsed() < Duration::from_millis(10) {
                    std::hint::spin_loop();
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        // `bursts <procs...>`: 100 ms of this thread's CPU time, then 100 ms asleep, forever.
        // Counted in CPU time, so that a throttled or descheduled burst still asks for all
        // of it: under a 40 % quota each burst runs out of at least two periods' quota,
        // however busy the host (`duty`, counted in wall time, asks for less when it gets
        // less), and the sleep leaves periods unthrottled.
        "bursts" => {
            join(&args[1..]);
            ready();
            loop {
                let start = super::clock(libc::CLOCK_THREAD_CPUTIME_ID);
                while super::clock(libc::CLOCK_THREAD_CPUTIME_ID).saturating_sub(start)
                    < Duration::from_millis(100)
                {
                    for _ in 0..1_000 {
                        std::hint::spin_loop();
                    }
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        // `container <lifetime_ms> <cache file or -> <procs...>`: what a short-lived
        // container does: some CPU, 1 MiB of anonymous memory, 16 KiB of page cache charged
        // to its cgroup (kept in the file, so that its memcg outlives the cgroup), then exit.
        "container" => {
            let lifetime: u64 = args.get(1).and_then(|v| v.parse().ok()).unwrap_or(1000);
            let cache = args.get(2).cloned().unwrap_or_else(|| "-".into());
            join(&args[3.min(args.len())..]);
            let mut mem = vec![0u8; 1 << 20];
            for i in (0..mem.len()).step_by(4096) {
                mem[i] = 1;
            }
            if cache != "-" {
                let _ = std::fs::write(&cache, vec![5u8; 16 << 10]);
            }
            let t = Instant::now();
            while t.elapsed() < Duration::from_millis(5) {
                std::hint::spin_loop();
            }
            std::thread::sleep(Duration::from_millis(lifetime));
            std::hint::black_box(&mem);
        }
        other => panic!("unknown workload {other:?}"),
    }
}
