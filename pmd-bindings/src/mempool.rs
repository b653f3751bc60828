//! Packet mbuf pools.

use std::ffi::{CStr, CString};
use std::ptr::NonNull;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::mbuf::Mbuf;
use crate::{eal, sys};

/// Headroom DPDK reserves at the front of every mbuf (`RTE_PKTMBUF_HEADROOM`).
pub const HEADROOM: u16 = sys::RTE_PKTMBUF_HEADROOM as u16;

/// Data room (headroom included) of DPDK's default mbuf: a 1500-byte MTU frame fits.
pub const DEFAULT_DATA_ROOM: u16 = sys::RTE_MBUF_DEFAULT_BUF_SIZE as u16;

/// Data room (headroom included) that fits a RoCEv2 frame with a 4096-byte path MTU in one
/// segment: 4096 payload + Ethernet 14 + VLAN 4 + IPv6 40 + UDP 8 + BTH 12 + the largest
/// extended headers (28) + ICRC 4 = 4206 bytes, rounded up to 4352, plus headroom.
pub const ROCE_4K_DATA_ROOM: u16 = HEADROOM + 4352;

/// Maximum mempool name length DPDK accepts (`RTE_MEMPOOL_NAMESIZE` minus its "MP_" prefix).
pub const MAX_NAME_LEN: usize = sys::RTE_MEMZONE_NAMESIZE as usize - 3 - 1;

/// A pool of packet mbufs (`rte_pktmbuf_pool_create`).
///
/// Shared through `Arc`: ports keep their receive pool alive. Dropping the last reference
/// frees the pool only when every mbuf is back in it; otherwise the pool is deliberately
/// leaked, because an mbuf still in flight would point into freed memory.
#[derive(Debug)]
pub struct Mempool {
    raw: NonNull<sys::rte_mempool>,
    name: String,
    data_room: u16,
}

// SAFETY: rte_mempool operations used here are multi-producer/multi-consumer safe (the default
// "ring_mp_mc" handler); the pointer is never used to mutate pool metadata from Rust.
unsafe impl Send for Mempool {}
// SAFETY: see Send.
unsafe impl Sync for Mempool {}

impl Mempool {
    /// Creates a packet mbuf pool of `n` mbufs, a per-lcore cache of `cache` mbufs, and
    /// `data_room` bytes per mbuf (headroom included; see [`ROCE_4K_DATA_ROOM`]).
    pub fn new(name: &str, n: u32, cache: u32, data_room: u16) -> Result<Arc<Mempool>> {
        eal::Eal::require()?;
        if name.is_empty() || name.len() > MAX_NAME_LEN {
            return Err(Error::InvalidArgument(format!(
                "mempool name {name:?} must be 1..={MAX_NAME_LEN} bytes"
            )));
        }
        if n == 0 || cache > sys::RTE_MEMPOOL_CACHE_MAX_SIZE || cache > n {
            return Err(Error::InvalidArgument(format!(
                "mempool {name}: {n} mbufs with a cache of {cache} is not valid"
            )));
        }
        if data_room <= HEADROOM {
            return Err(Error::InvalidArgument(format!(
                "mempool {name}: data room {data_room} leaves no space after the headroom"
            )));
        }
        let cname = CString::new(name)
            .map_err(|_| Error::InvalidArgument("mempool name contains NUL".into()))?;
        let _g = eal::control_lock();
        // SAFETY: EAL is initialised; cname is a valid C string; SOCKET_ID_ANY is accepted.
        let raw =
            unsafe { sys::rte_pktmbuf_pool_create(cname.as_ptr(), n, cache, 0, data_room, -1) };
        let raw = NonNull::new(raw).ok_or_else(|| Error::last("rte_pktmbuf_pool_create"))?;
        Ok(Arc::new(Mempool {
            raw,
            name: name.to_string(),
            data_room,
        }))
    }

    /// The pool's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Raw pointer for FFI (ports take it for their receive queues).
    pub fn as_ptr(&self) -> *mut sys::rte_mempool {
        self.raw.as_ptr()
    }

    /// Data room per mbuf, headroom included.
    pub fn data_room(&self) -> u16 {
        self.data_room
    }

    /// Largest frame one mbuf of this pool holds (data room minus headroom).
    pub fn max_frame_len(&self) -> usize {
        (self.data_room - HEADROOM) as usize
    }

    /// Total number of mbufs.
    pub fn capacity(&self) -> u32 {
        // SAFETY: the pool is alive; `size` is immutable after creation.
        unsafe { (*self.raw.as_ptr()).size }
    }

    /// Mbufs currently out of the pool (allocated, in a port's descriptors, in flight).
    /// Mbufs sitting in per-lcore caches count as available.
    pub fn in_use(&self) -> u32 {
        // SAFETY: the pool is alive; the count is a read of ring and cache lengths.
        unsafe { sys::ferroce_mempool_in_use_count(self.raw.as_ptr()) }
    }

    /// Mbufs available for allocation.
    pub fn available(&self) -> u32 {
        // SAFETY: as in_use.
        unsafe { sys::ferroce_mempool_avail_count(self.raw.as_ptr()) }
    }

    /// Writes the whole data room of up to `n` mbufs and gives them back. Called by a thread
    /// that is about to run a data path: its first allocations then take these mbufs from its
    /// lcore cache (last freed, first taken) with their lines already owned by its CPU,
    /// instead of paying a miss per cache line of every cold mbuf the first time through
    /// (the first 64 frames of a 4 KiB WRITE stream were built five times slower than the
    /// next). Takes at most a quarter of the mbufs available, so other threads running
    /// meanwhile are not starved, and never fails: it stops early when the pool runs out.
    pub fn warm(&self, n: usize) {
        let n = n.min(self.available() as usize / 4);
        let mut held = Vec::with_capacity(n);
        while held.len() < n {
            let Ok(mut m) = self.alloc() else { break };
            if let Some(room) = m.append(self.max_frame_len()) {
                room.fill(0);
            }
            held.push(m);
        }
    }

    /// Allocates one mbuf (empty, headroom reserved).
    #[inline]
    pub fn alloc(&self) -> Result<Mbuf> {
        // SAFETY: the pool is alive and is a pktmbuf pool.
        let m = unsafe { sys::ferroce_pktmbuf_alloc(self.raw.as_ptr()) };
        match NonNull::new(m) {
            // SAFETY: a freshly allocated mbuf is exclusively ours.
            Some(p) => Ok(unsafe { Mbuf::from_raw(p.as_ptr()) }),
            None => Err(Error::PoolExhausted(self.name.clone())),
        }
    }

    /// Allocates `n` mbufs at once and appends them to `out` (all or none). Reserve `out`'s
    /// capacity beforehand to keep the call allocation-free.
    pub fn alloc_bulk(&self, out: &mut Vec<Mbuf>, n: usize) -> Result<()> {
        out.reserve(n);
        let len = out.len();
        // SAFETY: capacity for n more entries was reserved; Mbuf is repr(transparent) over a
        // non-null *mut rte_mbuf, so the spare capacity can receive raw pointers; on success
        // all n are initialised before set_len.
        unsafe {
            let dst = out.as_mut_ptr().add(len) as *mut *mut sys::rte_mbuf;
            let ret = sys::ferroce_pktmbuf_alloc_bulk(self.raw.as_ptr(), dst, n as u32);
            if ret != 0 {
                return Err(Error::PoolExhausted(self.name.clone()));
            }
            out.set_len(len + n);
        }
        Ok(())
    }

    /// Name as DPDK stores it (for diagnostics).
    pub fn dpdk_name(&self) -> String {
        // SAFETY: the pool is alive; `name` is a NUL-terminated array inside it.
        unsafe {
            CStr::from_ptr((*self.raw.as_ptr()).name.as_ptr())
                .to_string_lossy()
                .into_owned()
        }
    }
}

impl Drop for Mempool {
    fn drop(&mut self) {
        if self.in_use() == 0 {
            let _g = eal::control_lock();
            // SAFETY: no mbuf is outstanding and no port references the pool (ports hold an
            // Arc to it), so nothing can touch the memory after it is freed.
            unsafe { sys::rte_mempool_free(self.raw.as_ptr()) };
        }
        // Otherwise leak: an outstanding mbuf would point into freed memory.
    }
}
