//! A short real soak (`rnic-soak`, what `scripts/soak.sh` runs for minutes): rnicd under
//! injected loss, duplication, reordering and corruption, mixed rnic-perf client processes
//! with `--verify`, some killed mid-run. rnic-soak judges the run itself (every run ended as
//! it should, rnicd back to idle, no unexplained error counter, flat memory); this checks that
//! it passed and that its figures show the faults, the kills and the sampling happened.

use std::path::Path;
use std::process::Command;

mod common;

use common::rnicd::{serial, temp_dir};

#[test]
fn a_short_soak_under_faults_and_kills_passes() {
    let _one = serial();
    let dir = temp_dir("soak");
    let out = dir.0.join("out");
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_rnicd")).parent().unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_rnic-soak"))
        .args(["--minutes", "0.3", "--pairs", "2", "--kill-every", "3"])
        .args(["--loss", "0.02", "--seed", "5"])
        // A debug build's resident memory moves more; the leak checks that matter here are
        // the objects and mbufs, which must come back exactly.
        .args(["--rss-slack-mib", "64"])
        .arg("--out")
        .arg(&out)
        .arg("--bin-dir")
        .arg(bin_dir)
        .output()
        .expect("run rnic-soak");
    let stdout = String::from_utf8_lossy(&o.stdout);
    let log = std::fs::read_to_string(out.join("rnicd.log")).unwrap_or_default();
    assert!(
        o.status.success(),
        "rnic-soak failed:\n{stdout}\n{}\nrnicd: {log}",
        String::from_utf8_lossy(&o.stderr)
    );
    let s: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("summary.json")).unwrap()).unwrap();
    assert!(s["runs_ok"].as_u64().unwrap() >= 3, "{s}");
    assert!(s["runs_killed"].as_u64().unwrap() >= 1, "{s}");
    assert_eq!(s["runs_failed"], 0, "{s}");
    assert!(
        s["faults"][0].as_u64().unwrap() > 0,
        "no frame was lost: {s}"
    );
    assert!(s["retransmitted_pkts"].as_u64().unwrap() > 0, "{s}");
    assert_eq!(s["objects_left"], 0, "{s}");
    // A row a second, every counter a column.
    let csv = std::fs::read_to_string(out.join("soak.csv")).unwrap();
    let head = csv.lines().next().unwrap();
    for col in [
        "t_s",
        "rss_kib",
        "mbufs_in_use",
        "res_qp",
        "fault_lost",
        "runs_ok",
    ] {
        assert!(head.split(',').any(|c| c == col), "no {col} in {head}");
    }
    assert!(csv.lines().count() >= 10, "{csv}");
    let runs = std::fs::read_to_string(out.join("runs.csv")).unwrap();
    assert!(runs.lines().count() > 4, "{runs}");
}
