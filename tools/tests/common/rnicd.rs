//! rnicd for the tools' tests: a private `rnicd --loopback` (two RNICs, ferroce0 and
//! ferroce1, joined by a DPDK ring link) and the helpers around it.
#![allow(dead_code)] // each test binary uses its own subset

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};

use serde_json::Value;
use std::time::{Duration, Instant};

/// One rnicd at a time: each runs a worker, and with two client processes the machine's two
/// cores are busy.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// A running `rnicd --loopback` on a private socket; stopped (SIGTERM) when dropped.
pub struct Rnicd {
    child: Option<Child>,
    /// Its socket.
    pub socket: PathBuf,
    _dir: TempDir,
}

/// A directory removed when dropped.
pub struct TempDir(pub PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A fresh directory under the system temp dir, unique to this process.
pub fn temp_dir(name: &str) -> TempDir {
    let d = std::env::temp_dir().join(format!("ferroce-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    TempDir(d)
}

impl Rnicd {
    /// Starts `rnicd --loopback` on a private socket, with `extra` arguments.
    pub fn start(name: &str, extra: &[&str]) -> Rnicd {
        let dir = temp_dir(name);
        let socket = dir.0.join("rnicd.sock");
        let mut child = Command::new(env!("CARGO_BIN_EXE_rnicd"))
            .args(["--loopback", "--socket"])
            .arg(&socket)
            .args(["--set", "worker.idle_sleep_us=50"])
            .args(extra)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn rnicd");
        // Up when it says it listens.
        let out = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if line.contains("listening on") {
                    let _ = tx.send(());
                }
            }
        });
        rx.recv_timeout(Duration::from_secs(30))
            .expect("rnicd did not start listening");
        Rnicd {
            child: Some(child),
            socket,
            _dir: dir,
        }
    }

    /// The socket path.
    pub fn sock(&self) -> &str {
        self.socket.to_str().unwrap()
    }

    /// SIGTERM and wait; returns the exit status.
    pub fn stop(&mut self) -> std::process::ExitStatus {
        let mut c = self.child.take().expect("running");
        // SAFETY: signalling our own child by its pid.
        unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(s) = c.try_wait().unwrap() {
                return s;
            }
            if Instant::now() > deadline {
                let _ = c.kill();
                panic!("rnicd did not stop on SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Rnicd {
    fn drop(&mut self) {
        if self.child.is_some() {
            self.stop();
        }
    }
}

/// A TCP port free now (for the perftest-style exchange).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// An rnic-perf command through rnicd at `sock`, with JSON output.
pub fn perf(sock: &str, dev: &str, test: &str, port: u16, args: &[&str], server: bool) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_rnic-perf"));
    c.arg(test)
        .args([
            "--rnicd",
            sock,
            "-d",
            dev,
            "-p",
            &port.to_string(),
            "--json",
        ])
        .args(args)
        .env("RUST_LOG", "error");
    // Ended with the thread that started it: a test that panics leaves no rnic-perf server
    // waiting for a client that never comes.
    // SAFETY: prctl is async-signal-safe; it runs in the child between fork and exec.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut c, || {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    if !server {
        c.arg("127.0.0.1");
    }
    c
}

/// The JSON a successful command printed.
pub fn json(o: &Output, what: &str) -> Value {
    assert!(
        o.status.success(),
        "{what} failed: {}\n{}",
        String::from_utf8_lossy(&o.stderr),
        String::from_utf8_lossy(&o.stdout)
    );
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "{what}: bad JSON {e}: {}",
            String::from_utf8_lossy(&o.stdout)
        )
    })
}

/// `rnic-ctl --socket SOCK ARGS...`.
pub fn ctl(sock: &str, args: &[&str]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_rnic-ctl"));
    c.args(["--socket", sock]).args(args);
    super::run_for(&mut c, Duration::from_secs(30)).0
}

/// `rnic-ctl ... --json`, parsed.
pub fn ctl_json(sock: &str, args: &[&str]) -> Value {
    let mut a = args.to_vec();
    a.push("--json");
    json(&ctl(sock, &a), &format!("rnic-ctl {args:?}"))
}

/// Waits until rnicd holds no object and no client.
pub fn wait_idle(sock: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let v = ctl_json(sock, &["res"]);
        let empty = |k: &str| v[k].as_array().is_some_and(|a| a.is_empty());
        if empty("qps") && empty("objects") && empty("clients") {
            return v;
        }
        assert!(Instant::now() < deadline, "rnicd still holds objects: {v}");
        std::thread::sleep(Duration::from_millis(50));
    }
}
