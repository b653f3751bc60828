//! Memory areas shared between applications and workers: application buffers that memory
//! regions point into, and the areas holding the host-interface rings.
//!
//! An [`Area`] is page-aligned anonymous memory (`mmap`). Today application and worker share
//! one process; areas are named by a numeric id in an [`AreaRegistry`], and rings and commands
//! refer to them only by id and offset (never by pointer), so that the next milestone can back
//! the same ids with shared memory between processes.
//!
//! Application and worker touch the same bytes concurrently, as an application and a NIC's DMA
//! do: all accesses go through raw-pointer copies and atomics, never through Rust references
//! held across the other side's writes.

use std::collections::HashMap;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use roce::memory::{Memory, MemoryError};

/// Page-aligned, zero-initialised memory.
pub struct Area {
    ptr: NonNull<u8>,
    len: usize,
    id: u32,
}

// SAFETY: the area is plain memory; every access is a raw copy or an atomic, bounds-checked.
unsafe impl Send for Area {}
// SAFETY: see Send.
unsafe impl Sync for Area {}

impl std::fmt::Debug for Area {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Area#{}({} bytes @ {:p})", self.id, self.len, self.ptr)
    }
}

impl Area {
    fn map(len: usize, id: u32) -> std::io::Result<Area> {
        let len = len.max(1);
        // SAFETY: anonymous private mapping; the result is checked.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Area {
            ptr: NonNull::new(p as *mut u8).expect("mmap returned non-null"),
            len,
            id,
        })
    }

    /// Its id in the registry.
    pub fn id(&self) -> u32 {
        self.id
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The address the application sees (what it registers MRs at and advertises to peers).
    pub fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    /// Raw pointer to the start.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    fn check(&self, off: usize, n: usize) -> Result<(), MemoryError> {
        match off.checked_add(n) {
            Some(e) if e <= self.len => Ok(()),
            _ => Err(MemoryError::OutOfBounds),
        }
    }

    /// Copies bytes out (bounds-checked).
    pub fn read_at(&self, off: usize, dst: &mut [u8]) -> Result<(), MemoryError> {
        self.check(off, dst.len())?;
        // SAFETY: in bounds; the area lives as long as &self; racing with the other side's
        // writes is the DMA model documented above.
        unsafe {
            std::ptr::copy_nonoverlapping(self.ptr.as_ptr().add(off), dst.as_mut_ptr(), dst.len())
        };
        Ok(())
    }

    /// Copies bytes in (bounds-checked), ascending, the last byte last (see [`Memory::write`]).
    pub fn write_at(&self, off: usize, src: &[u8]) -> Result<(), MemoryError> {
        self.check(off, src.len())?;
        let Some((&last, body)) = src.split_last() else {
            return Ok(());
        };
        // SAFETY: in bounds (checked); the final byte is stored with release semantics after
        // the rest, so a reader that sees it (acquire) sees the whole message.
        unsafe {
            let dst = self.ptr.as_ptr().add(off);
            std::ptr::copy_nonoverlapping(body.as_ptr(), dst, body.len());
            (*(dst.add(body.len()) as *const AtomicU8)).store(last, Ordering::Release);
        }
        Ok(())
    }

    /// Reads one byte with acquire ordering (polling for an incoming RDMA WRITE).
    pub fn load_u8(&self, off: usize) -> u8 {
        assert!(off < self.len, "Area::load_u8 out of bounds");
        // SAFETY: in bounds; an AtomicU8 view of a byte is always valid.
        unsafe { (*(self.ptr.as_ptr().add(off) as *const AtomicU8)).load(Ordering::Acquire) }
    }

    /// An 8-byte-aligned atomic word at `off`.
    pub fn atomic_u64(&self, off: usize) -> Result<&AtomicU64, MemoryError> {
        self.check(off, 8)?;
        if (self.ptr.as_ptr() as usize + off) % 8 != 0 {
            return Err(MemoryError::Misaligned);
        }
        // SAFETY: in bounds and aligned; the area outlives the reference.
        Ok(unsafe { &*(self.ptr.as_ptr().add(off) as *const AtomicU64) })
    }
}

impl Memory for Area {
    fn len(&self) -> usize {
        self.len
    }

    fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), MemoryError> {
        self.read_at(offset, dst)
    }

    fn write(&self, offset: usize, src: &[u8]) -> Result<(), MemoryError> {
        self.write_at(offset, src)
    }

    fn compare_swap(&self, offset: usize, compare: u64, swap: u64) -> Result<u64, MemoryError> {
        let w = self.atomic_u64(offset)?;
        Ok(
            match w.compare_exchange(compare, swap, Ordering::AcqRel, Ordering::Acquire) {
                Ok(v) | Err(v) => v,
            },
        )
    }

    fn fetch_add(&self, offset: usize, add: u64) -> Result<u64, MemoryError> {
        Ok(self.atomic_u64(offset)?.fetch_add(add, Ordering::AcqRel))
    }
}

impl Drop for Area {
    fn drop(&mut self) {
        // SAFETY: we mapped exactly this range and nobody holds a reference (Arc dropped).
        unsafe { libc::munmap(self.ptr.as_ptr() as *mut libc::c_void, self.len) };
    }
}

/// Names areas by id: the namespace applications and workers share.
#[derive(Debug, Default)]
pub struct AreaRegistry {
    inner: Mutex<(u32, HashMap<u32, Arc<Area>>)>,
}

impl AreaRegistry {
    /// An empty registry.
    pub fn new() -> Arc<AreaRegistry> {
        Arc::new(AreaRegistry::default())
    }

    /// Allocates a zeroed area of `len` bytes.
    pub fn create(&self, len: usize) -> std::io::Result<Arc<Area>> {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        g.0 += 1;
        let id = g.0;
        let a = Arc::new(Area::map(len, id)?);
        g.1.insert(id, a.clone());
        Ok(a)
    }

    /// The area with this id.
    pub fn get(&self, id: u32) -> Option<Arc<Area>> {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .1
            .get(&id)
            .cloned()
    }

    /// Number of areas named.
    pub fn len(&self) -> usize {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).1.len()
    }

    /// Whether no area is named.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Forgets an area (it is unmapped once the last user drops it).
    pub fn remove(&self, id: u32) -> Option<Arc<Area>> {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .1
            .remove(&id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn area_memory_contract() {
        let r = AreaRegistry::new();
        let a = r.create(100).unwrap();
        assert_eq!(a.addr() % 4096, 0, "page aligned");
        a.write_at(10, b"hello").unwrap();
        let mut b = [0u8; 5];
        a.read_at(10, &mut b).unwrap();
        assert_eq!(&b, b"hello");
        assert_eq!(a.load_u8(14), b'o');
        assert_eq!(a.write_at(98, b"abc"), Err(MemoryError::OutOfBounds));
        assert_eq!(a.read_at(usize::MAX, &mut b), Err(MemoryError::OutOfBounds));
        assert_eq!(a.fetch_add(16, 5).unwrap(), 0);
        assert_eq!(a.compare_swap(16, 5, 9).unwrap(), 5);
        assert_eq!(a.fetch_add(17, 1), Err(MemoryError::Misaligned));
        assert!(Arc::ptr_eq(&r.get(a.id()).unwrap(), &a));
        r.remove(a.id());
        assert!(r.get(a.id()).is_none());
    }
}
