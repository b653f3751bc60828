//! Helpers shared by the tools' integration tests.

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
