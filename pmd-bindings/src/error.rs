//! DPDK failures as a typed Rust error carrying `rte_errno` and its text.

use std::ffi::CStr;

use crate::sys;

/// Everything the wrappers can fail with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// `rte_eal_init` runs at most once per process (DPDK refuses a second call even after
    /// `rte_eal_cleanup`), so a second attempt is this error, not a crash.
    #[error("the DPDK EAL is already initialised in this process")]
    AlreadyInitialized,
    /// A call that needs the EAL was made before `Eal::init` succeeded.
    #[error("the DPDK EAL is not initialised")]
    NotInitialized,
    /// A DPDK call failed; `errno` is the (positive) `rte_errno` or negated return value.
    #[error("{op} failed: {msg} (errno {errno})")]
    Dpdk {
        /// The DPDK operation that failed, e.g. `rte_eth_dev_configure`.
        op: &'static str,
        /// The positive errno value.
        errno: i32,
        /// `rte_strerror(errno)`.
        msg: String,
    },
    /// The port's driver does not implement this operation (`-ENOTSUP`).
    #[error("{op}: not supported by this port's driver")]
    NotSupported {
        /// The DPDK operation.
        op: &'static str,
    },
    /// An argument was rejected before reaching DPDK.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The mempool had no free mbuf.
    #[error("mempool {0} is exhausted")]
    PoolExhausted(String),
}

impl Error {
    /// Builds an error from a positive errno value.
    pub fn from_errno(op: &'static str, errno: i32) -> Self {
        let errno = errno.abs();
        if errno == libc::ENOTSUP || errno == libc::EOPNOTSUPP {
            return Error::NotSupported { op };
        }
        Error::Dpdk {
            op,
            errno,
            msg: strerror(errno),
        }
    }

    /// Builds an error from the calling thread's current `rte_errno`.
    pub fn last(op: &'static str) -> Self {
        Self::from_errno(op, errno())
    }

    /// Maps a DPDK return convention (`0` or positive = success, negative = `-errno`).
    pub fn check(op: &'static str, ret: i32) -> Result<i32, Self> {
        if ret < 0 {
            Err(Self::from_errno(op, -ret))
        } else {
            Ok(ret)
        }
    }

    /// The errno value, when this error carries one.
    pub fn errno(&self) -> Option<i32> {
        match self {
            Error::Dpdk { errno, .. } => Some(*errno),
            Error::NotSupported { .. } => Some(libc::ENOTSUP),
            _ => None,
        }
    }
}

/// The calling thread's `rte_errno` (a thread-local macro in C, read through the shim).
pub fn errno() -> i32 {
    // SAFETY: reads a thread-local integer; no preconditions.
    unsafe { sys::ferroce_errno() }
}

/// `rte_strerror` as an owned string.
pub fn strerror(errno: i32) -> String {
    // SAFETY: rte_strerror returns a pointer to a static or thread-local NUL-terminated string
    // for any input value; we copy it out before any other DPDK call can overwrite it.
    unsafe {
        let p = sys::rte_strerror(errno);
        if p.is_null() {
            return format!("errno {errno}");
        }
        CStr::from_ptr(p).to_string_lossy().into_owned()
    }
}

/// Short alias used throughout the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
