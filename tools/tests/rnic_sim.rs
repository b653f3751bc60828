//! rnic-sim: the scenarios' outcomes (fairness after convergence, a bounded queue under
//! DCQCN, no drops with PFC, drops without PFC and ECN, the PFC victim and its fix), the CSV
//! and PNG it writes, and clear errors for bad arguments.

use std::path::{Path, PathBuf};
use std::process::Command;

use ferroce_tools::sim_tool::{self as st, Preset};

#[test]
fn dcqcn_converges_to_fair_shares_for_both_presets() {
    for preset in [Preset::Paper, Preset::Nvidia] {
        let o = st::dcqcn(4, 40.0, preset, 40_000_000, 2_500_000);
        let s = st::summarise(&o, &[0, 1, 2, 3]);
        assert!(s.jain >= 0.95, "{preset:?}: Jain {}", s.jain);
        assert!(
            s.goodput > 0.85 * 40.0 * st::payload_share(1024),
            "{preset:?}: {s:?}"
        );
        let (red, _) = preset.marking(40.0);
        assert!(
            s.queue_mean_kb * 1000.0 < red.kmax as f64,
            "{preset:?}: the queue stays below Kmax on average: {s:?}"
        );
        assert_eq!(s.drops, 0);
        assert!(s.cnps > 0);
    }
}

#[test]
fn incast_is_lossless_with_pfc_and_lossy_without_pfc_and_ecn() {
    let with = st::summarise(
        &st::incast(8, 100.0, false, true, 5_000_000),
        &(0..8).collect::<Vec<_>>(),
    );
    assert_eq!(with.drops, 0, "{with:?}");
    assert!(with.pfc_xoff > 0 && with.paused_fraction > 0.5, "{with:?}");
    let without = st::summarise(
        &st::incast(8, 100.0, false, false, 5_000_000),
        &(0..8).collect::<Vec<_>>(),
    );
    assert!(without.drops > 0, "{without:?}");
    // DCQCN takes over from PFC: few pauses once converged.
    let dcqcn = st::summarise(
        &st::incast(8, 100.0, true, true, 20_000_000),
        &(0..8).collect::<Vec<_>>(),
    );
    assert_eq!(dcqcn.drops, 0);
    assert!(dcqcn.late_paused_senders < 0.05, "{dcqcn:?}");
    assert!(
        dcqcn.paused_fraction < with.paused_fraction / 10.0,
        "{dcqcn:?} vs {with:?}"
    );
}

#[test]
fn pfc_alone_makes_a_victim_and_dcqcn_frees_it() {
    let potential = 100.0 * st::payload_share(1024) * 0.75;
    let (o, v) = st::pfc_victim(4, 100.0, false, 10_000_000);
    let hol = o.mean_goodput(v, 5_000.0);
    assert!(
        hol < 0.5 * potential,
        "head-of-line blocked: {hol} of {potential}"
    );
    let (o, v) = st::pfc_victim(4, 100.0, true, 10_000_000);
    let free = o.mean_goodput(v, 5_000.0);
    assert!(free > 0.9 * potential, "with DCQCN: {free} of {potential}");
}

fn rnic_sim(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_rnic-sim"))
        .args(args)
        .output()
        .expect("rnic-sim")
}

/// Runs `rnic-sim ARGS`, which must succeed, and returns its standard output.
fn rnic_sim_ok(args: &[&str]) -> String {
    let o = rnic_sim(args);
    assert!(
        o.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Runs `rnic-sim ARGS`, which must fail with a reason and without a panic.
fn assert_refused(args: &[&str]) {
    let o = rnic_sim(args);
    assert!(!o.status.success(), "{args:?} accepted");
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(!e.contains("panicked") && !e.is_empty(), "{args:?}: {e}");
}

/// The files a test writes, in a `ferroce-NAME-PID` directory under the system temp dir
/// (the test removes it at its end): the directory and `STEM.csv` and `STEM.png` in it.
fn out_files(name: &str, stem: &str) -> (PathBuf, PathBuf, PathBuf) {
    let dir = std::env::temp_dir().join(format!("ferroce-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (csv, png) = (
        dir.join(format!("{stem}.csv")),
        dir.join(format!("{stem}.png")),
    );
    (dir, csv, png)
}

/// Runs `rnic-sim ARGS --csv CSV --png PNG`, which must succeed, with the files of
/// `out_files(name, stem)`; its standard output, and the directory and files.
fn rnic_sim_to_files(name: &str, stem: &str, args: &[&str]) -> (String, PathBuf, PathBuf, PathBuf) {
    let (dir, csv, png) = out_files(name, stem);
    let files = [
        "--csv",
        csv.to_str().unwrap(),
        "--png",
        png.to_str().unwrap(),
    ];
    let out = rnic_sim_ok(&[args, &files].concat());
    (out, dir, csv, png)
}

/// Asserts that the file at `path` is a PNG image (by its signature).
fn assert_png(path: &Path) {
    let bytes = std::fs::read(path).unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "{}", path.display());
}

/// The number after `name` on the `rnics` result line that starts with `scenario`.
fn scenario_field(out: &str, scenario: &str, name: &str) -> f64 {
    let line = out
        .lines()
        .find(|l| l.starts_with(scenario))
        .unwrap_or_else(|| panic!("{scenario} missing: {out}"));
    let mut it = line.split_whitespace();
    it.find(|w| *w == name).expect(name);
    it.next().unwrap().parse().unwrap()
}

#[test]
fn the_cli_writes_csv_and_png() {
    let (out, dir, csv, png) = rnic_sim_to_files(
        "sim",
        "d",
        &[
            "dcqcn",
            "--flows",
            "3",
            "--rate",
            "25",
            "--preset",
            "paper",
            "--duration",
            "5",
        ],
    );
    assert!(out.contains("Jain") && out.contains("fair share"), "{out}");
    let text = std::fs::read_to_string(&csv).unwrap();
    let mut lines = text.lines();
    assert_eq!(
        lines.next(),
        Some("time_us,flow,rate_gbps,goodput_gbps,queue_kb")
    );
    let rows: Vec<Vec<f64>> = lines
        .map(|l| l.split(',').map(|v| v.parse().unwrap()).collect())
        .collect();
    assert!(
        rows.len() > 300 && rows.len().is_multiple_of(3),
        "{} rows",
        rows.len()
    );
    assert!(rows
        .iter()
        .all(|r| r.len() == 5 && r[2] >= 0.0 && r[2] <= 25.0));
    assert_png(&png);
    for args in [
        vec![
            "incast",
            "--senders",
            "4",
            "--duration",
            "2",
            "--png",
            dir.join("i.png").to_str().unwrap(),
        ],
        vec![
            "pfc",
            "--duration",
            "2",
            "--png",
            dir.join("p.png").to_str().unwrap(),
        ],
        vec![
            "compare",
            "--duration",
            "2",
            "--png",
            dir.join("c.png").to_str().unwrap(),
        ],
    ] {
        rnic_sim_ok(&args);
    }
    for bad in [
        vec!["dcqcn", "--flows", "0"],
        vec!["dcqcn", "--rate", "-1"],
        vec!["incast", "--duration", "0"],
        vec!["dcqcn", "--preset", "mlx9"],
        vec!["dcqcn", "--csv", "/nonexistent/x.csv", "--duration", "1"],
    ] {
        assert_refused(&bad);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `rnic-sim rnics`: ferroce's transport engines through the switch model. All three
/// scenarios print; PFC alone never drops; DCQCN quiets PFC; the CSV has every sender's
/// samples; bad arguments are refused.
#[test]
fn rnics_incast_prints_the_three_scenarios_and_writes_csv() {
    let (out, dir, csv, png) = rnic_sim_to_files(
        "rnics",
        "r",
        &[
            "rnics",
            "--senders",
            "4",
            "--rate",
            "10",
            "--duration",
            "10",
        ],
    );
    let field = |scenario: &str, name: &str| scenario_field(&out, scenario, name);
    for s in ["pfc-only", "dcqcn-paper", "dcqcn-nvidia"] {
        assert_eq!(field(s, "drops"), 0.0, "{s}: {out}");
        assert!(field(s, "aggregate") > 8.0, "{s}: {out}");
    }
    assert!(field("pfc-only", "XOFF") > 10.0 * field("dcqcn-paper", "XOFF").max(1.0));
    let text = std::fs::read_to_string(&csv).unwrap();
    assert!(text.starts_with("scenario,time_us,sender,goodput_gbps,queue_kb\n"));
    let senders: std::collections::BTreeSet<&str> = text
        .lines()
        .skip(1)
        .map(|l| l.split(',').nth(2).unwrap())
        .collect();
    assert_eq!(senders.len(), 4);
    assert_png(&png);
    for bad in [
        vec!["rnics", "--dcqcn", "fast"],
        vec!["rnics", "--senders", "0"],
        vec!["rnics", "--rate", "0.5"],
        vec!["rnics", "--dpdk", "0.5"],
        vec!["rnics", "--dpdk", "100000"],
        vec!["rnics", "--depth", "0"],
    ] {
        assert_refused(&bad);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `rnic-sim rnics --dpdk 10`: the same 8:1 incast for real, ferroce RNICs on DPDK through
/// the emulated switch, slowed ten times (2.5 Gb/s links). With PFC alone and 16 WRITEs
/// outstanding per sender (a window of 512 KiB, more than an ingress port holds above XOFF)
/// the switch pauses the senders and drops nothing (with the RNICs ignoring the pauses,
/// thousands of frames are dropped); with DCQCN (paper, 4 deep as published) the receiver's
/// CNPs slow the senders, the bottleneck queue's 99th percentile stays below Kmax (400 KB),
/// and nothing is dropped. Rates and fairness are printed, not asserted (real time on a
/// shared machine).
#[test]
fn rnics_incast_on_dpdk_is_lossless_and_dcqcn_bounds_the_queue() {
    let run = |dcqcn: &str, depth: &str| {
        let o = rnic_sim(&["rnics", "--dpdk", "10", "--dcqcn", dcqcn, "--depth", depth]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    // One scenario per run: its line is the one that starts with a scenario name.
    let field = |out: &str, name: &str| {
        let scenario = if out.contains("\npfc-only") {
            "pfc-only"
        } else {
            "dcqcn-"
        };
        scenario_field(out, scenario, name)
    };
    let pfc = run("off", "16");
    assert!(pfc.contains("on DPDK through the emulated switch"), "{pfc}");
    assert_eq!(field(&pfc, "drops"), 0.0, "{pfc}");
    assert!(field(&pfc, "XOFF") > 0.0, "PFC paused the senders: {pfc}");
    let paper = run("paper", "4");
    assert_eq!(field(&paper, "drops"), 0.0, "{paper}");
    assert!(field(&paper, "CNPs") > 0.0, "{paper}");
    assert!(
        field(&paper, "p99") < 400.0,
        "queue p99 below Kmax: {paper}"
    );
    println!("{pfc}{paper}");
}
