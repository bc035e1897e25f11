//! Faults another privileged process can inflict on the eBPF collector, on this machine's
//! kernel, and what the agent does about them:
//!
//! 1. `BPF_LINK_DETACH` on the agent's iterator links (by id): the kernel refuses it
//!    (iterator links have no detach operation); collection goes on, untouched.
//! 2. Writing the agent's records map, walk counters or creation instants by map id
//!    (`BPF_MAP_UPDATE_ELEM`, a writable `mmap`): refused, the maps are frozen.
//! 3. The links' program replaced (`BPF_LINK_UPDATE`) by a second copy of our program, and
//!    by a minimal `iter/cgroup` program: detected on the next tick, linked again, counted;
//!    that tick still reports, and every number matches the kernel's `cpu.stat`.
//! 4. Another process running iterators of the agent's link while it collects: every tick
//!    that reports has the right numbers.
//! 5. `--collector auto` with the program replaced on three consecutive ticks: falls back to
//!    cgroupfs, unloads the program, and no cgroup's CPU counter goes backwards.
//! 6. The real `kpulse-agent run`: the warning names the link and the programs, the
//!    self-metrics count the relink, and persistent interference ends in the fallback.
//!
//! Needs root and BPF. Outside CI it skips with a reason when they are missing; with
//! `CI=true` it fails instead.

mod common;

use std::{
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use common::{agent::Agent, bpf, TestCgroups};
use kpulse_agent::{
    collect::{AutoCollector, CollectError, Collector, EbpfCollector, Scope},
    layout::Layout,
    probe::CgroupIter,
    sample::{Snapshot, Source},
};

fn main() {
    if common::workload::dispatch() {
        return;
    }
    common::main_of("faults", common::ebpf_preflight, run);
}

/// The test's cgroups and what it checks against.
struct Setup {
    layout: Layout,
    parent: String,
    scope: Scope,
    burn: String,
    failures: Vec<String>,
    /// Programs this test loaded itself (copies, foreign ones), checked gone at the end.
    ours: Vec<u32>,
}

impl Setup {
    fn fail(&mut self, what: String) {
        eprintln!("faults: FAILED: {what}");
        self.failures.push(what);
    }

    /// Collects once, with the burner's `cpu.stat` read just before and just after: a
    /// reported CPU time outside that interval is a wrong number.
    fn collect_checked(&mut self, c: &mut dyn Collector) -> Result<Snapshot, CollectError> {
        let before = common::cpu_stat_ns(&self.layout, &self.burn);
        let r = c.collect();
        let after = common::cpu_stat_ns(&self.layout, &self.burn) + 999;
        if let Ok(snap) = &r {
            self.check_burn(snap, before, after);
        }
        r
    }

    fn check_burn(&mut self, snap: &Snapshot, before: u64, after: u64) {
        match snap.cgroups.iter().find(|c| *c.path == *self.burn) {
            Some(c) => match c.cpu {
                Some(cpu) if cpu.0 >= before && cpu.0 <= after => {}
                other => self.fail(format!(
                    "{} collector: {} CPU {other:?} outside the kernel's {before}..={after}",
                    snap.source, self.burn
                )),
            },
            None => self.fail(format!("{} missing from a {} tick", self.burn, snap.source)),
        }
    }
}

fn run() {
    let layout = Layout::detect().expect("layout");
    let parent = format!("kpulse-faults-{}", std::process::id());
    let mut cg = TestCgroups::create(&layout, &parent, &["burn"]);
    cg.spawn_workload("duty", &[], "burn", true);
    let scope = Scope {
        layout: layout.clone(),
        root: format!("/{parent}"),
        max_cgroups: 64,
        signals: Default::default(),
    };
    let mut s = Setup {
        burn: format!("/{parent}/burn"),
        layout: layout.clone(),
        parent,
        scope,
        failures: Vec::new(),
        ours: Vec::new(),
    };
    println!("faults: layout {}, kernel {}", layout.name(), kernel());

    let object = kpulse_agent::probe::object_bytes(None).expect("object");
    // A second loaded copy of our own program: what a second agent, or anyone with our
    // object, could put on our links.
    let copy = CgroupIter::load(&object, 64).expect("second copy of the program");
    let copy_id = copy.program_id().expect("copy id");
    s.ours.push(copy_id);
    let minimal = bpf::load_minimal_cgroup_iter().expect("load a minimal iter/cgroup program");
    let minimal_id = bpf::own_prog_id(&minimal).expect("minimal program id");
    s.ours.push(minimal_id);

    let mut ebpf = EbpfCollector::new(s.scope.clone(), None).expect("eBPF collector");
    let ours = ebpf.program_id().expect("program id");
    s.ours.push(ours);
    s.collect_checked(&mut ebpf).expect("first tick");

    detach_attempt(&mut s, &mut ebpf);
    map_writes(&mut s, &ebpf);
    program_replaced(&mut s, &mut ebpf, copy_id, "a second copy of our program");
    program_replaced(
        &mut s,
        &mut ebpf,
        minimal_id,
        "a minimal iter/cgroup program",
    );
    concurrent_walks(&mut s, &mut ebpf);
    drop(ebpf);
    fallback(&mut s, copy_id);
    agent_binary(&mut s, copy_id);

    drop(copy);
    drop(minimal);
    drop(cg);
    leftovers(&mut s);
    if !s.failures.is_empty() {
        panic!("{} fault checks failed", s.failures.len());
    }
}

/// 1. `BPF_LINK_DETACH` by id: EOPNOTSUPP, and collection goes on with the same links.
fn detach_attempt(s: &mut Setup, ebpf: &mut EbpfCollector) {
    let links = ebpf.link_ids();
    for &l in &links {
        match bpf::link_detach(l) {
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => {
                println!("faults: BPF_LINK_DETACH of link {l}: {e} (as expected)");
            }
            other => s.fail(format!(
                "BPF_LINK_DETACH of iterator link {l} gave {other:?}, not EOPNOTSUPP"
            )),
        }
    }
    let before = ebpf.stats();
    if let Err(e) = s.collect_checked(ebpf) {
        s.fail(format!("tick after the detach attempts failed: {e}"));
    }
    if ebpf.link_ids() != links
        || ebpf.stats().relinks_program_replaced != before.relinks_program_replaced
    {
        s.fail("a refused detach made the collector relink".into());
    }
}

/// 2. The records map, the walk counters and the creation instants cannot be written
///    from user space.
fn map_writes(s: &mut Setup, ebpf: &EbpfCollector) {
    let mut seen = Vec::new();
    for id in ebpf.map_ids() {
        let name = bpf::map_name(id).unwrap_or_default();
        let (size, len) = if name.contains("CGROUP_RECORDS") {
            (std::mem::size_of::<kpulse_common::CgroupRecord>(), 4096 * 4)
        } else if name.contains(".bss") {
            (16, 4096)
        } else if name.contains("CGROUP_BIRTHS") {
            (8, 0)
        } else {
            continue;
        };
        seen.push(name.clone());
        match bpf::map_write_first(id, size) {
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => {}
            other => s.fail(format!(
                "BPF_MAP_UPDATE_ELEM on {name} ({id}) gave {other:?}, not EPERM"
            )),
        }
        if name.contains("CGROUP_RECORDS") {
            match bpf::map_mmap_writable(id, len) {
                Err(e) if e.raw_os_error() == Some(libc::EPERM) => {}
                other => s.fail(format!(
                    "writable mmap of {name} ({id}) gave {other:?}, not EPERM"
                )),
            }
        }
    }
    println!("faults: user-space writes refused on {seen:?}");
    if seen.len() != 3 {
        s.fail(format!(
            "expected the records map, .bss and the creation instants among the maps, saw {seen:?}"
        ));
    }
}

/// 3. Every link's program replaced: the next tick detects it, relinks, and reports the
///    right numbers.
fn program_replaced(s: &mut Setup, ebpf: &mut EbpfCollector, foreign: u32, what: &str) {
    let ours = ebpf.program_id().unwrap_or(0);
    let links = ebpf.link_ids();
    for &l in &links {
        bpf::link_update(l, foreign)
            .unwrap_or_else(|e| panic!("BPF_LINK_UPDATE {l} → {foreign}: {e}"));
        assert_eq!(
            bpf::link_program(l),
            Some(foreign),
            "link {l} runs {foreign} now"
        );
    }
    let before = ebpf.stats().relinks_program_replaced;
    let started = Instant::now();
    match s.collect_checked(ebpf) {
        Ok(_) => {}
        Err(e) => s.fail(format!(
            "the first tick after {what} replaced our program failed: {e}"
        )),
    }
    let took = started.elapsed();
    let relinked = ebpf.stats().relinks_program_replaced - before;
    let now = ebpf.link_ids();
    println!(
        "faults: {what} (program {foreign}) on links {links:?}: detected and relinked in the \
         next tick ({took:?}), {relinked} relinks, links now {now:?}"
    );
    if relinked != links.len() as u64 {
        s.fail(format!(
            "{what}: {relinked} relinks counted for {} links",
            links.len()
        ));
    }
    for (&old, &new) in links.iter().zip(&now) {
        if old == new || bpf::link_program(new) != Some(ours) {
            s.fail(format!(
                "{what}: link {old} not replaced by a link to our program {ours}"
            ));
        }
    }
    // And the ticks after are clean.
    let before = ebpf.stats();
    for _ in 0..2 {
        if let Err(e) = s.collect_checked(ebpf) {
            s.fail(format!("{what}: a later tick failed: {e}"));
        }
    }
    if ebpf.stats().relinks_program_replaced != before.relinks_program_replaced {
        s.fail(format!("{what}: relinked again without interference"));
    }
}

/// 4. Another process walks our link (by id) continuously while we collect: ticks either
///    report the right numbers or fail; none reports a wrong one.
fn concurrent_walks(s: &mut Setup, ebpf: &mut EbpfCollector) {
    let link = ebpf.link_ids()[0];
    let stop = Arc::new(AtomicBool::new(false));
    let walks = Arc::new(AtomicU64::new(0));
    let t = {
        let (stop, walks) = (stop.clone(), walks.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if bpf::run_iterator(link).is_ok() {
                    walks.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
    };
    let before = ebpf.stats().foreign_walks;
    let (mut ok, mut failed) = (0, 0);
    let mut errors = std::collections::BTreeMap::<String, usize>::new();
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline {
        match s.collect_checked(ebpf) {
            Ok(_) => ok += 1,
            Err(e) => {
                failed += 1;
                let e = e.to_string();
                let kind = e
                    .split(':')
                    .next_back()
                    .unwrap_or_default()
                    .trim()
                    .to_owned();
                *errors.entry(kind).or_default() += 1;
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    stop.store(true, Ordering::Relaxed);
    let _ = t.join();
    let foreign = ebpf.stats().foreign_walks - before;
    println!(
        "faults: {} foreign walks of link {link} during {} ticks: {ok} reported (numbers \
         checked), {failed} failed {errors:?}, {foreign} walks redone",
        walks.load(Ordering::Relaxed),
        ok + failed
    );
    if ok == 0 {
        s.fail("no tick reported while another process walked our link".into());
    }
}

/// 5. `auto`: the program replaced before each of three consecutive ticks → cgroupfs, the
///    program unloaded, counters continuous.
fn fallback(s: &mut Setup, foreign: u32) {
    let ebpf = EbpfCollector::new(s.scope.clone(), None).expect("eBPF collector");
    let ours = ebpf.program_id().expect("program id");
    s.ours.push(ours);
    let mut auto = AutoCollector::new(ebpf, s.scope.clone());
    let mut last_ebpf = 0;
    for tick in 1..=kpulse_agent::collect::FALLBACK_AFTER {
        let links = auto.ebpf().map(EbpfCollector::link_ids).unwrap_or_default();
        for l in links {
            bpf::link_update(l, foreign).unwrap_or_else(|e| panic!("BPF_LINK_UPDATE: {e}"));
        }
        match s.collect_checked(&mut auto) {
            Ok(snap) => {
                last_ebpf = burn_cpu(&snap, &s.burn);
                if snap.source != Source::Ebpf {
                    s.fail(format!("interfered tick {tick} came from {}", snap.source));
                }
            }
            Err(e) => s.fail(format!("interfered tick {tick} failed: {e}")),
        }
    }
    let st = auto.stats();
    println!(
        "faults: auto after {} interfered ticks: collector {}, {} fallback, {} relinks",
        kpulse_agent::collect::FALLBACK_AFTER,
        auto.source(),
        st.fallbacks,
        st.relinks_program_replaced
    );
    if auto.source() != Source::Cgroupfs || st.fallbacks != 1 {
        s.fail("auto did not fall back to cgroupfs".into());
    }
    if !wait_gone("prog", ours) {
        s.fail(format!("program {ours} still loaded after the fallback"));
    }
    for _ in 0..3 {
        match s.collect_checked(&mut auto) {
            Ok(snap) => {
                let v = burn_cpu(&snap, &s.burn);
                if snap.source != Source::Cgroupfs || v < last_ebpf {
                    s.fail(format!(
                        "after the fallback: {} tick, CPU {v} < last eBPF value {last_ebpf}",
                        snap.source
                    ));
                }
                last_ebpf = v;
            }
            Err(e) => s.fail(format!("cgroupfs tick after the fallback failed: {e}")),
        }
    }
}

/// 6. The same, seen from outside: `kpulse-agent run`'s log and `/metrics`.
fn agent_binary(s: &mut Setup, foreign: u32) {
    let dir = std::env::temp_dir().join(format!("kpulse-faults-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let pods = dir.join("pods.json");
    std::fs::write(&pods, r#"{"pods":[]}"#).expect("pods file");
    let port = common::agent::free_port();
    let closed = common::agent::free_port();
    let args: Vec<String> = [
        "run",
        "--node-name",
        "faults",
        "--pods-file",
        &pods.display().to_string(),
        "--server",
        &format!("127.0.0.1:{closed}"),
        "--insecure-skip-tls-verify",
        "--metrics-bind-address",
        &format!("127.0.0.1:{port}"),
        "--resolution",
        "200ms",
        "--collector",
        "auto",
        "--cgroup-root",
        &s.scope.root,
        "--max-cgroups",
        "64",
    ]
    .iter()
    .map(|a| a.to_string())
    .collect();
    let mut agent = Agent::spawn(&args, Some(port));
    let ticking = agent.wait_metric(
        "kpulse_agent_cgroups",
        |v| v >= 2.0,
        Duration::from_secs(20),
    );
    let outcome = (|| -> Result<(), String> {
        ticking.ok_or_else(|| format!("the agent did not tick: {}", agent.log()))?;
        let held = bpf::held_by(agent.pid);
        let prog = held
            .iter_links
            .first()
            .map(|&(_, p)| p)
            .ok_or("the agent holds no iterator link")?;
        let links: Vec<u32> = held.iter_links.iter().map(|&(l, _)| l).collect();
        // One replacement.
        let t = Instant::now();
        for &l in &links {
            bpf::link_update(l, foreign).map_err(|e| format!("BPF_LINK_UPDATE: {e}"))?;
        }
        let line = agent
            .wait_log(
                &[
                    "WARN",
                    "replaced the program",
                    &format!("link_id={}", links[0]),
                    &format!("found_program_id={foreign}"),
                    &format!("our_program_id={prog}"),
                ],
                Duration::from_secs(5),
            )
            .ok_or_else(|| format!("no warning naming link and programs: {}", agent.log()))?;
        let detected = t.elapsed();
        let series = "kpulse_agent_ebpf_relinks_total{reason=\"program_replaced\"}";
        let n = agent
            .wait_metric(series, |v| v >= links.len() as f64, Duration::from_secs(5))
            .ok_or("relinks not counted")?;
        println!("faults: agent binary: warned {detected:?} after the replacement: {line}");
        println!("faults: agent binary: {series} {n}");
        let errors = agent.metric("kpulse_agent_collection_errors_total");
        if errors != Some(0.0) {
            return Err(format!(
                "collection errors after one replacement: {errors:?}"
            ));
        }
        if agent.metric("kpulse_agent_collector{collector=\"ebpf\"}") != Some(1.0) {
            return Err("not on eBPF any more after one replacement".into());
        }
        // Persistent interference: replace whatever the agent links, until it falls back.
        let t = Instant::now();
        let cgroupfs = "kpulse_agent_collector{collector=\"cgroupfs\"}";
        while agent.metric(cgroupfs) != Some(1.0) {
            if t.elapsed() > Duration::from_secs(20) {
                return Err(format!(
                    "no fallback under persistent interference: {}",
                    agent.log()
                ));
            }
            for (l, p) in bpf::held_by(agent.pid).iter_links {
                if p != foreign {
                    let _ = bpf::link_update(l, foreign);
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let line = agent
            .wait_log(
                &["WARN", "reading cgroupfs until the agent restarts"],
                Duration::from_secs(2),
            )
            .ok_or("no fallback warning")?;
        println!(
            "faults: agent binary: fell back after {:?}: {line}",
            t.elapsed()
        );
        if agent.metric("kpulse_agent_collector_fallbacks_total") != Some(1.0) {
            return Err("fallback not counted".into());
        }
        let t = Instant::now();
        while !bpf::held_by(agent.pid).is_empty() {
            if t.elapsed() > Duration::from_secs(5) {
                return Err(format!(
                    "the agent still holds {:?} after the fallback",
                    bpf::held_by(agent.pid)
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        if !wait_gone("prog", prog) {
            return Err(format!(
                "the agent's program {prog} is still loaded after the fallback"
            ));
        }
        // Still collecting, from cgroupfs.
        let ticks = agent
            .metric("kpulse_agent_collection_duration_seconds_count")
            .unwrap_or(0.0);
        agent
            .wait_metric(
                "kpulse_agent_collection_duration_seconds_count",
                |v| v >= ticks + 3.0,
                Duration::from_secs(5),
            )
            .ok_or("no ticks after the fallback")?;
        Ok(())
    })();
    drop(agent);
    let _ = std::fs::remove_dir_all(&dir);
    if let Err(e) = outcome {
        s.fail(format!("agent binary: {e}"));
    }
}

fn burn_cpu(snap: &Snapshot, burn: &str) -> u64 {
    snap.cgroups
        .iter()
        .find(|c| *c.path == *burn)
        .and_then(|c| c.cpu)
        .map_or(0, |c| c.0)
}

fn wait_gone(kind: &str, id: u32) -> bool {
    let t = Instant::now();
    while bpf::exists(kind, id) {
        if t.elapsed() > Duration::from_secs(5) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

/// No cgroup, process or BPF object of this test remains.
fn leftovers(s: &mut Setup) {
    for m in common::mounts(&s.layout) {
        if m.join(&s.parent).exists() {
            s.fail(format!(
                "cgroup {} left behind",
                m.join(&s.parent).display()
            ));
        }
    }
    for id in s.ours.clone() {
        if !wait_gone("prog", id) {
            s.fail(format!("program {id} still loaded"));
        }
    }
    let held = bpf::held_by(std::process::id());
    if !held.is_empty() {
        s.fail(format!("the test still holds BPF objects {held:?}"));
    }
}

fn kernel() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}
