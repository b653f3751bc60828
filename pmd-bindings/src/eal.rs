//! The DPDK Environment Abstraction Layer: argument builder, one-time initialisation, worker
//! lcore launch, non-EAL thread registration and clean shutdown.
//!
//! DPDK allows `rte_eal_init` once per process (a second call fails with `EALREADY`, even after
//! `rte_eal_cleanup`), so [`Eal`] is a process-wide singleton: [`EalBuilder::init`] succeeds once
//! and returns `&'static Eal`; later attempts return [`Error::AlreadyInitialized`].

use std::any::Any;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::marker::PhantomData;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use crate::error::{Error, Result};
use crate::sys;

static EAL: OnceLock<Eal> = OnceLock::new();
/// The addresses of the argument strings and pointer array handed to `rte_eal_init` (leaked
/// on purpose: EAL may keep pointers into them).
static EAL_ARGV: OnceLock<(usize, usize)> = OnceLock::new();
/// Serialises `rte_eal_init` attempts and records that one was made (even a failed one: DPDK
/// does not allow a retry after a failed init either).
static INIT_ATTEMPTED: Mutex<bool> = Mutex::new(false);
/// Serialises DPDK control-path calls (device probe/remove, port configure/start/stop/close,
/// mempool and ring creation). DPDK documents these as not thread-safe against each other,
/// and the Rust test harness runs tests on parallel threads.
pub(crate) static CONTROL: Mutex<()> = Mutex::new(());

/// Takes the control-path lock, tolerating poisoning (a panicking test must not wedge others).
pub(crate) fn control_lock() -> std::sync::MutexGuard<'static, ()> {
    CONTROL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Builds the EAL argument vector.
///
/// Defaults suit these machines (no hugetlbfs mounted, two cores shared with other
/// processes): see [`EalBuilder::software`].
#[derive(Debug, Clone)]
pub struct EalBuilder {
    program: String,
    args: Vec<String>,
    file_prefix: Option<String>,
    remove_runtime_dir_at_exit: bool,
}

impl EalBuilder {
    /// An empty argument list (`program` becomes argv[0]).
    pub fn new(program: &str) -> Self {
        EalBuilder {
            program: program.to_string(),
            args: Vec::new(),
            file_prefix: None,
            remove_runtime_dir_at_exit: true,
        }
    }

    /// Arguments that work on a machine without hugepages or PCI devices and share its CPUs:
    /// `--no-huge --no-pci -m 512 --no-shconf --no-telemetry`, lcore 0 floating over every
    /// CPU, EAL logging at warning level, and a file prefix unique to this process.
    pub fn software(program: &str) -> Self {
        EalBuilder::new(program)
            .no_huge()
            .no_pci()
            .memory_mb(512)
            .no_shconf()
            .no_telemetry()
            .floating_lcores(1)
            .log_level("lib.eal:warning")
            .file_prefix(&format!("{}-{}", sanitize(program), std::process::id()))
    }

    /// Adds one raw argument.
    pub fn arg(mut self, arg: &str) -> Self {
        if let Some(p) = arg.strip_prefix("--file-prefix=") {
            self.file_prefix = Some(p.to_string());
        }
        self.args.push(arg.to_string());
        self
    }

    /// Adds raw arguments (e.g. split from a config file's `eal` string).
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        for a in args {
            self = self.arg(a.as_ref());
        }
        self
    }

    /// `--no-huge`: back DPDK memory with ordinary pages (IOVA as VA).
    pub fn no_huge(self) -> Self {
        self.arg("--no-huge")
    }

    /// `--no-pci`: do not scan the PCI bus.
    pub fn no_pci(self) -> Self {
        self.arg("--no-pci")
    }

    /// `-m N`: memory in MiB (needed with `--no-huge` for pools of 16k+ mbufs).
    pub fn memory_mb(self, mb: u32) -> Self {
        self.arg("-m").arg(&mb.to_string())
    }

    /// `--no-shconf`: no shared config, so several processes can run at once.
    pub fn no_shconf(self) -> Self {
        self.arg("--no-shconf")
    }

    /// `--no-telemetry`: one thread fewer.
    pub fn no_telemetry(self) -> Self {
        self.arg("--no-telemetry")
    }

    /// `--in-memory` (with hugepages mounted).
    pub fn in_memory(self) -> Self {
        self.arg("--in-memory")
    }

    /// `--file-prefix=P`; the runtime directory becomes `/var/run/dpdk/P` (as root).
    pub fn file_prefix(mut self, prefix: &str) -> Self {
        self.args.retain(|a| !a.starts_with("--file-prefix="));
        self.arg(&format!("--file-prefix={prefix}"))
    }

    /// `--vdev=DEVARGS`: a virtual device probed at init.
    pub fn vdev(self, devargs: &str) -> Self {
        self.arg(&format!("--vdev={devargs}"))
    }

    /// `--lcores=SPEC` verbatim (e.g. `0@(0-1),1@(0-1)`).
    pub fn lcores(mut self, spec: &str) -> Self {
        self.args.retain(|a| !a.starts_with("--lcores="));
        self.arg(&format!("--lcores={spec}"))
    }

    /// `n` lcores (0..n), each allowed to run on every CPU of this process, so that processes
    /// and lcores float instead of piling onto CPU 0 (see dpdk.md).
    pub fn floating_lcores(self, n: u32) -> Self {
        let cpus = available_cpus();
        let set = if cpus <= 1 {
            "0".to_string()
        } else {
            format!("0-{}", cpus - 1)
        };
        let spec = (0..n.max(1))
            .map(|l| format!("{l}@({set})"))
            .collect::<Vec<_>>()
            .join(",");
        self.lcores(&spec)
    }

    /// `--log-level=SPEC`.
    pub fn log_level(self, spec: &str) -> Self {
        self.arg(&format!("--log-level={spec}"))
    }

    /// Whether to remove the EAL runtime directory when the process exits (default: yes).
    pub fn remove_runtime_dir_at_exit(mut self, yes: bool) -> Self {
        self.remove_runtime_dir_at_exit = yes;
        self
    }

    /// The argument vector as it will be passed (argv[0] first).
    pub fn argv(&self) -> Vec<String> {
        std::iter::once(self.program.clone())
            .chain(self.args.iter().cloned())
            .collect()
    }

    /// Initialises the EAL. Succeeds at most once per process.
    pub fn init(self) -> Result<&'static Eal> {
        let mut attempted = INIT_ATTEMPTED.lock().unwrap_or_else(|e| e.into_inner());
        if *attempted {
            return Err(Error::AlreadyInitialized);
        }
        *attempted = true;
        let argv = self.argv();
        let mut cstrings = Vec::with_capacity(argv.len());
        for a in &argv {
            cstrings.push(CString::new(a.as_str()).map_err(|_| {
                Error::InvalidArgument(format!("EAL argument contains a NUL byte: {a:?}"))
            })?);
        }
        // EAL may keep pointers into argv (it permutes it and some options hold on to the
        // strings), so the strings live for the rest of the process.
        let cstrings: &'static mut [CString] = Vec::leak(cstrings);
        let mut ptrs: Vec<*mut c_char> = cstrings
            .iter_mut()
            .map(|c| c.as_ptr() as *mut c_char)
            .collect();
        ptrs.push(std::ptr::null_mut());
        let ptrs: &'static mut [*mut c_char] = Vec::leak(ptrs);
        // Reachable from a static for the rest of the process, so that leak checkers
        // (LeakSanitizer under the fuzz targets) do not report them.
        let _ = EAL_ARGV.set((cstrings.as_ptr() as usize, ptrs.as_ptr() as usize));
        let argc = argv.len() as c_int;
        // SAFETY: argc/argv describe valid NUL-terminated strings that live forever; this is
        // the only rte_eal_init call in the process (guarded by INIT_ATTEMPTED).
        let ret = unsafe { sys::rte_eal_init(argc, ptrs.as_mut_ptr()) };
        if ret < 0 {
            return Err(Error::last("rte_eal_init"));
        }
        // SAFETY: after a successful init rte_eal_get_runtime_dir returns a static string.
        let runtime_dir = unsafe {
            let p = sys::rte_eal_get_runtime_dir();
            if p.is_null() {
                None
            } else {
                Some(PathBuf::from(
                    CStr::from_ptr(p).to_string_lossy().into_owned(),
                ))
            }
        };
        if self.remove_runtime_dir_at_exit {
            if let Some(dir) = &runtime_dir {
                register_exit_cleanup(dir);
            }
        }
        let eal = Eal {
            argv,
            runtime_dir,
            file_prefix: self.file_prefix,
        };
        Ok(EAL.get_or_init(|| eal))
    }
}

/// The initialised EAL (process-wide).
#[derive(Debug)]
pub struct Eal {
    argv: Vec<String>,
    runtime_dir: Option<PathBuf>,
    file_prefix: Option<String>,
}

impl Eal {
    /// The EAL, if [`EalBuilder::init`] has succeeded in this process.
    pub fn get() -> Option<&'static Eal> {
        EAL.get()
    }

    /// The EAL, or [`Error::NotInitialized`].
    pub fn require() -> Result<&'static Eal> {
        EAL.get().ok_or(Error::NotInitialized)
    }

    /// The arguments it was initialised with.
    pub fn argv(&self) -> &[String] {
        &self.argv
    }

    /// The runtime directory EAL created (`/var/run/dpdk/<prefix>` as root).
    pub fn runtime_dir(&self) -> Option<&Path> {
        self.runtime_dir.as_deref()
    }

    /// The `--file-prefix`, when one was given.
    pub fn file_prefix(&self) -> Option<&str> {
        self.file_prefix.as_deref()
    }

    /// The main lcore (the thread that called init).
    pub fn main_lcore(&self) -> u32 {
        // SAFETY: EAL is initialised.
        unsafe { sys::rte_get_main_lcore() }
    }

    /// Number of enabled lcores, main included.
    pub fn lcore_count(&self) -> u32 {
        // SAFETY: EAL is initialised.
        unsafe { sys::rte_lcore_count() }
    }

    /// The enabled worker lcores (all but the main one), ascending.
    pub fn worker_lcores(&self) -> Vec<u32> {
        let mut out = Vec::new();
        let mut i = u32::MAX; // rte_get_next_lcore starts after `i`; -1 means from the start.
        loop {
            // SAFETY: EAL is initialised; the function only reads the lcore config table.
            i = unsafe { sys::rte_get_next_lcore(i, 1, 0) };
            if i >= sys::RTE_MAX_LCORE {
                break;
            }
            out.push(i);
        }
        out
    }

    /// Whether IOVA addresses are virtual addresses (true with `--no-huge`).
    pub fn iova_is_va(&self) -> bool {
        // SAFETY: EAL is initialised.
        unsafe { sys::rte_eal_iova_mode() == sys::RTE_IOVA_VA }
    }

    /// Runs `f` on worker lcore `lcore`; the returned handle joins it.
    ///
    /// A panic inside `f` is caught on the lcore and handed back by [`LcoreJoin::join`].
    pub fn launch<F, T>(&self, lcore: u32, f: F) -> Result<LcoreJoin<T>>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        if !self.worker_lcores().contains(&lcore) {
            return Err(Error::InvalidArgument(format!(
                "lcore {lcore} is not an enabled worker lcore"
            )));
        }
        let slot = Box::new(LaunchSlot::<T> {
            f: Some(Box::new(f)),
            result: None,
        });
        let raw = Box::into_raw(slot);
        // SAFETY: `trampoline::<T>` matches lcore_function_t; `raw` stays valid until the
        // lcore finishes (LcoreJoin owns it and frees it only after rte_eal_wait_lcore).
        let ret =
            unsafe { sys::rte_eal_remote_launch(Some(trampoline::<T>), raw as *mut c_void, lcore) };
        if ret < 0 {
            // SAFETY: the launch failed, so the lcore never saw `raw`; reclaim it.
            drop(unsafe { Box::from_raw(raw) });
            return Err(Error::from_errno("rte_eal_remote_launch", -ret));
        }
        Ok(LcoreJoin { lcore, slot: raw })
    }

    /// Registers the calling (non-EAL) thread so it gets an lcore id and per-lcore mempool
    /// caches. Unregistered when the guard drops.
    pub fn register_thread(&self) -> Result<ThreadRegistration> {
        // SAFETY: EAL is initialised; registers the calling thread only.
        let ret = unsafe { sys::rte_thread_register() };
        if ret < 0 {
            return Err(Error::last("rte_thread_register"));
        }
        Ok(ThreadRegistration {
            _not_send: PhantomData,
        })
    }

    /// Tears the EAL down (`rte_eal_cleanup`) and removes its runtime directory.
    ///
    /// # Safety
    /// No DPDK object (mempool, mbuf, port, ring) may be used after this call, by any thread,
    /// and no worker lcore may still be running.
    pub unsafe fn shutdown(&self) -> Result<()> {
        // SAFETY: caller guarantees no DPDK object is used after this point.
        let ret = unsafe { sys::rte_eal_cleanup() };
        if let Some(dir) = &self.runtime_dir {
            remove_runtime_dir(dir);
        }
        Error::check("rte_eal_cleanup", ret).map(|_| ())
    }
}

/// The lcore id of the calling thread (`u32::MAX` = `LCORE_ID_ANY` for unregistered threads).
pub fn lcore_id() -> u32 {
    // SAFETY: reads a thread-local variable.
    unsafe { sys::ferroce_lcore_id() }
}

/// Reads the time-stamp counter.
#[inline]
pub fn rdtsc() -> u64 {
    // SAFETY: rdtsc has no preconditions.
    unsafe { sys::ferroce_rdtsc() }
}

/// TSC frequency in Hz as EAL measured it.
pub fn tsc_hz() -> u64 {
    // SAFETY: valid after EAL init; returns 0 before it.
    unsafe { sys::ferroce_tsc_hz() }
}

/// Proof that the calling thread is registered with EAL; unregisters on drop. Not `Send`:
/// the registration belongs to the thread.
#[derive(Debug)]
pub struct ThreadRegistration {
    _not_send: PhantomData<*const ()>,
}

impl Drop for ThreadRegistration {
    fn drop(&mut self) {
        // SAFETY: this thread registered itself and is still running.
        unsafe { sys::rte_thread_unregister() };
    }
}

/// What a launched lcore runs and where it leaves the result. Owned by [`LcoreJoin`]; the
/// lcore touches it only between `rte_eal_remote_launch` and `rte_eal_wait_lcore`.
struct LaunchSlot<T> {
    f: Option<Box<dyn FnOnce() -> T + Send>>,
    result: Option<std::thread::Result<T>>,
}

extern "C" fn trampoline<T: Send + 'static>(arg: *mut c_void) -> c_int {
    // SAFETY: `arg` is the LaunchSlot handed to rte_eal_remote_launch; only this lcore touches
    // it until rte_eal_wait_lcore returns on the launching side.
    let slot = unsafe { &mut *(arg as *mut LaunchSlot<T>) };
    if let Some(f) = slot.f.take() {
        // Unwinding across the FFI boundary would abort: catch it and report it through the
        // slot instead.
        slot.result = Some(std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)));
    }
    0
}

/// Handle to a closure running on a worker lcore. Dropping it waits for the closure.
pub struct LcoreJoin<T> {
    lcore: u32,
    slot: *mut LaunchSlot<T>,
}

// SAFETY: the handle owns the slot; the lcore only uses it until rte_eal_wait_lcore returns,
// and the result (T: Send) is read afterwards.
unsafe impl<T: Send> Send for LcoreJoin<T> {}

impl<T> LcoreJoin<T> {
    /// The lcore the closure runs on.
    pub fn lcore(&self) -> u32 {
        self.lcore
    }

    /// Waits for the closure; returns its value, or the panic payload if it panicked.
    pub fn join(self) -> std::result::Result<T, Box<dyn Any + Send>> {
        // SAFETY: `lcore` was launched by us with this slot.
        unsafe { sys::rte_eal_wait_lcore(self.lcore) };
        // SAFETY: the lcore finished, so we are the slot's only user; Drop frees it.
        let slot = unsafe { &mut *self.slot };
        slot.result
            .take()
            .unwrap_or_else(|| Err(Box::new("lcore closure did not run")))
    }
}

impl<T> Drop for LcoreJoin<T> {
    fn drop(&mut self) {
        // SAFETY: waiting again after join is harmless (the lcore is already WAIT); after it
        // returns the lcore no longer uses the slot, which we allocated with Box::into_raw.
        unsafe {
            sys::rte_eal_wait_lcore(self.lcore);
            drop(Box::from_raw(self.slot));
        }
    }
}

fn sanitize(s: &str) -> String {
    let base = Path::new(s)
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_else(|| "ferroce".into());
    base.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .take(24)
        .collect()
}

fn available_cpus() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

static EXIT_DIR: OnceLock<PathBuf> = OnceLock::new();

extern "C" fn exit_cleanup() {
    if let Some(dir) = EXIT_DIR.get() {
        remove_runtime_dir(dir);
    }
}

fn register_exit_cleanup(dir: &Path) {
    if EXIT_DIR.set(dir.to_path_buf()).is_ok() {
        // SAFETY: registers a plain extern "C" function with no captured state.
        unsafe { libc::atexit(exit_cleanup) };
    }
}

/// Removes an EAL runtime directory (EAL leaves it behind even with `--no-shconf`). Only
/// directories under a `dpdk` parent are touched, so a bad prefix cannot remove anything else.
fn remove_runtime_dir(dir: &Path) {
    let under_dpdk = dir
        .parent()
        .and_then(|p| p.file_name())
        .map(|n| n == "dpdk")
        .unwrap_or(false);
    if under_dpdk {
        let _ = std::fs::remove_dir_all(dir);
    }
}
