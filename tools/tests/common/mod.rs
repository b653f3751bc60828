//! Helpers shared by the tools' integration tests.
// Each test binary uses a subset of these helpers.
#![allow(dead_code)]

pub mod rnicd;

use std::io::Read;
use std::path::{Path, PathBuf};
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

/// The directory of this build's binaries (target/debug or target/release).
fn bin_dir() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_rnicd")).parent().unwrap()
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The newest modification time of a file, or of the files under a directory.
fn newest(p: &Path) -> std::time::SystemTime {
    let meta = std::fs::metadata(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    if !meta.is_dir() {
        return meta.modified().unwrap();
    }
    std::fs::read_dir(p)
        .unwrap()
        .map(|e| newest(&e.unwrap().path()))
        .max()
        .unwrap_or(std::time::SystemTime::UNIX_EPOCH)
}

/// The number after `flag` in a perftest command line `args`, if the flag is there (a
/// flag without a number after it panics).
pub fn flag_number(args: &[&str], flag: &str) -> Option<u64> {
    let i = args.iter().position(|a| *a == flag)?;
    Some(args[i + 1].parse().unwrap())
}

/// This build's cdylib `file` of `package` (cargo test does not build cdylibs; `make test`
/// builds them before the tests), next to the binaries, where `make install-files` and
/// `make ibverbs-dir` look: the newest copy (a dependency build leaves it in deps/, a
/// direct build next to the binaries), checked to be newer than `sources` (files, or directories of them).
pub fn fresh_cdylib(file: &str, package: &str, sources: &[&str]) -> PathBuf {
    let bin = bin_dir();
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let lib = [bin.join(file), bin.join("deps").join(file)]
        .into_iter()
        .filter_map(|p| Some((modified(&p)?, p)))
        .max()
        .map(|(_, p)| p)
        .unwrap_or_else(|| {
            panic!(
                "{}/{file} not found: run `cargo build -p {package}` (make test does)",
                bin.display()
            )
        });
    let built = modified(&lib).unwrap();
    for src in sources {
        assert!(
            newest(&workspace().join(src)) <= built,
            "{} is older than {src}: run `cargo build -p {package}` (make test does)",
            lib.display()
        );
    }
    if lib != bin.join(file) {
        std::fs::copy(&lib, bin.join(file)).unwrap();
    }
    bin.join(file)
}

/// `make -s TARGET PROFILE=<this build's> ARGS...` in the workspace; panics with its error
/// output if it fails.
pub fn make(target: &str, args: &[String]) {
    let profile = bin_dir().file_name().unwrap().to_string_lossy().to_string();
    ferroce_tests::output_ok(
        Command::new("make")
            .current_dir(workspace())
            .args(["-s", target])
            .arg(format!("PROFILE={profile}"))
            .args(args),
        &format!("make {target}"),
    );
}

/// The directory `ferroce-run` puts first on the library path (ferroce's libibverbs.so.1
/// and the libmlx5/libefa stubs), made by `make ibverbs-dir` from this build's cdylib.
pub fn ibverbs_libdir() -> PathBuf {
    fresh_cdylib(
        "libibverbs.so",
        "ferroce-ibverbs",
        &["dataplane/ibverbs/src", "dataplane/host/src"],
    );
    make("ibverbs-dir", &[]);
    bin_dir().join("ferroce")
}

#[allow(unused_imports)] // not every test binary needs it
pub use ferroce_tests::process_temp_dir;
