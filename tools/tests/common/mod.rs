//! Helpers shared by the tools' integration tests.
// Each test binary uses a subset of these helpers.
#![allow(dead_code)]

pub mod rnicd;

use std::io::Read;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Runs `cmd` to completion with its output captured, killing it once `limit` has passed (a
/// test must fail, not hang). Returns the output and whether the limit killed it.
pub fn run_for(cmd: &mut Command, limit: Duration) -> (Output, bool) {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
    // Drain the pipes while waiting, so a chatty child cannot block on a full pipe.
    let mut so = child.stdout.take().unwrap();
    let mut se = child.stderr.take().unwrap();
    let t1 = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = so.read_to_end(&mut v);
        v
    });
    let t2 = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = se.read_to_end(&mut v);
        v
    });
    let deadline = Instant::now() + limit;
    let mut killed = false;
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait") {
            break st;
        }
        if Instant::now() > deadline {
            // SIGTERM first, so that a ferroce tool can clean up (its DPDK runtime
            // directory); SIGKILL if it has not ended within 5 s.
            // SAFETY: signalling our own unreaped child.
            unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
            let grace = Instant::now() + Duration::from_secs(5);
            while Instant::now() < grace && child.try_wait().ok().flatten().is_none() {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            killed = true;
            break child.wait().expect("wait");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let out = Output {
        status,
        stdout: t1.join().unwrap(),
        stderr: t2.join().unwrap(),
    };
    (out, killed)
}

/// The directory `ferroce-run` puts first on the library path (ferroce's libibverbs.so.1
/// and the libmlx5/libefa stubs), made by `make ibverbs-dir` from this build's cdylib, which
/// must be fresh (`make test` builds it before the tests: cargo test does not build cdylibs).
pub fn ibverbs_libdir() -> std::path::PathBuf {
    use std::path::Path;
    let bin = Path::new(env!("CARGO_BIN_EXE_rnicd")).parent().unwrap();
    let ws = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let profile = bin.file_name().unwrap().to_string_lossy().to_string();
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    // The newest copy: a dependency build leaves it in deps/, a direct build next to the
    // binaries.
    let lib = [bin.join("libibverbs.so"), bin.join("deps/libibverbs.so")]
        .into_iter()
        .filter_map(|p| Some((modified(&p)?, p)))
        .max()
        .map(|(_, p)| p)
        .unwrap_or_else(|| {
            panic!(
                "{}/libibverbs.so not found: run `cargo build -p ferroce-ibverbs` (make test does)",
                bin.display()
            )
        });
    let built = modified(&lib).unwrap();
    for src in [
        "dataplane/ibverbs/src/lib.rs",
        "dataplane/src/host.rs",
        "dataplane/src/shadow.rs",
    ] {
        assert!(
            modified(&ws.join(src)).unwrap() <= built,
            "{} is older than {src}: run `cargo build -p ferroce-ibverbs` (make test does)",
            lib.display()
        );
    }
    if lib != bin.join("libibverbs.so") {
        std::fs::copy(&lib, bin.join("libibverbs.so")).unwrap();
    }
    let o = Command::new("make")
        .current_dir(&ws)
        .args(["-s", "ibverbs-dir"])
        .arg(format!("PROFILE={profile}"))
        .output()
        .expect("make");
    assert!(
        o.status.success(),
        "make ibverbs-dir: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    bin.join("ferroce")
}

#[allow(unused_imports)] // not every test binary needs it
pub use ferroce_tests::process_temp_dir;
