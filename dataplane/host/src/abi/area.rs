//! Memory areas shared between applications and the RNIC: application buffers that memory
//! regions point into, and the areas holding the host-interface rings.
//!
//! An [`Area`] is page-aligned memory backed by a memfd, so it can be mapped by another process
//! (`rnicd` and its clients pass the fd with SCM_RIGHTS). An area made here is sealed against
//! shrinking and growing before anyone else sees it; an area taken from another process's fd
//! ([`Area::from_fd`]) is mapped only if that fd is a memfd sealed against shrinking and at
//! least as large as claimed, so its owner cannot make the mapping fault (SIGBUS) by
//! truncating it. Rings and commands refer to areas by a per-client id and offsets, never by
//! pointer.
//!
//! Application and RNIC touch the same bytes concurrently, as an application and a NIC's DMA
//! do: all accesses go through raw-pointer copies and atomics, never through Rust references
//! held across the other side's writes.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

use roce::memory::{Memory, MemoryError};
use roce::wire::icrc::Icrc;

/// Page size (areas are whole pages).
pub const PAGE: usize = 4096;

/// Page-aligned, zero-initialised shared memory.
///
/// The memfd is kept only while the area may still be sent to another process: an area mapped
/// from another process's fd ([`Area::from_fd`]) closes it at once, and the creator of an area
/// closes it ([`Area::close_fd`]) once it has sent it. A mapping outlives its fd, so rnicd holds
/// no descriptor per client area and cannot run out of them however many areas clients add.
pub struct Area {
    ptr: NonNull<u8>,
    len: usize,
    fd: std::sync::Mutex<Option<OwnedFd>>,
    /// The memfd's inode (to recognise the mapping in /proc/self/smaps after the fd is gone).
    ino: u64,
    /// Unmapped on drop (false for application memory moved onto a memfd in place, which
    /// stays mapped for the application: [`crate::app::shadow`]).
    owned: bool,
}

// SAFETY: the area is plain memory; every access is a raw copy or an atomic, bounds-checked.
unsafe impl Send for Area {}
// SAFETY: see Send.
unsafe impl Sync for Area {}

impl std::fmt::Debug for Area {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Area({} bytes @ {:p})", self.len, self.ptr)
    }
}

fn last_err() -> std::io::Error {
    std::io::Error::last_os_error()
}

/// The largest range [`Area::populate`] faults in at once (64 MiB: about 15 ms of page
/// faults here).
pub const POPULATE_MAX: usize = 64 << 20;

/// Rounds `len` up to whole pages (at least one).
pub fn page_round(len: usize) -> usize {
    len.max(1).div_ceil(PAGE) * PAGE
}

impl Area {
    /// A new zeroed area of `len` bytes (rounded up to pages) on a memfd named `name` (shown in
    /// /proc/PID/maps), sealed against shrinking, growing and further sealing.
    pub fn new(len: usize, name: &str) -> std::io::Result<Area> {
        let fd = Self::memfd(len, name)?;
        let len = page_round(len);
        // SAFETY: our own fd; F_ADD_SEALS with known flags.
        let r = unsafe {
            libc::fcntl(
                fd.as_raw_fd(),
                libc::F_ADD_SEALS,
                libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL,
            )
        };
        if r < 0 {
            return Err(last_err());
        }
        Self::map(fd, len)
    }

    /// An unsealed memfd of `len` bytes (rounded to pages), for callers that fill it before
    /// sealing it (the client library moving application pages onto one).
    pub fn memfd(len: usize, name: &str) -> std::io::Result<OwnedFd> {
        let cname = std::ffi::CString::new(name.replace('\0', "?")).unwrap_or_default();
        // SAFETY: valid C string; the result is checked.
        let raw = unsafe {
            libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
        };
        if raw < 0 {
            return Err(last_err());
        }
        // SAFETY: a fresh fd we own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: our fd; the length fits off_t.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), page_round(len) as libc::off_t) } < 0 {
            return Err(last_err());
        }
        Ok(fd)
    }

    /// Maps an area another process sent: `fd` must be a memfd on shmem (not hugetlbfs or any
    /// other file system, whose pages can fail to materialise on a later fault), sealed at
    /// least against shrinking (F_SEAL_SHRINK), holding at least `len` bytes; anything else is
    /// refused, so its sender can never make this mapping fault (SIGBUS) by truncating the
    /// file or by the pages running out. The fd is closed once mapped.
    pub fn from_fd(fd: OwnedFd, len: usize) -> std::io::Result<Area> {
        // SAFETY: fstatfs into a zeroed struct on an fd we hold.
        let mut sfs: libc::statfs = unsafe { std::mem::zeroed() };
        if unsafe { libc::fstatfs(fd.as_raw_fd(), &mut sfs) } < 0 {
            return Err(last_err());
        }
        if sfs.f_type != libc::TMPFS_MAGIC {
            let what = if sfs.f_type == libc::HUGETLBFS_MAGIC {
                "a hugetlb memfd (its pages can run out and fault the RNIC)".to_string()
            } else {
                format!("on a file system of type {:#x}", sfs.f_type)
            };
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("not a shmem memfd: {what}"),
            ));
        }
        // SAFETY: F_GET_SEALS on an fd we hold; fails with EINVAL for non-memfds.
        let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
        if seals < 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "not a memfd (cannot read its seals)",
            ));
        }
        if seals & libc::F_SEAL_SHRINK == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "the memfd is not sealed against shrinking (F_SEAL_SHRINK)",
            ));
        }
        // SAFETY: fstat into a zeroed struct.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } < 0 {
            return Err(last_err());
        }
        let size = st.st_size as usize;
        let len = page_round(len);
        if size < len {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("the memfd holds {size} bytes, {len} claimed"),
            ));
        }
        let area = Self::map(fd, len)?;
        area.close_fd();
        Ok(area)
    }

    fn map(fd: OwnedFd, len: usize) -> std::io::Result<Area> {
        // SAFETY: fstat into a zeroed struct on our fd.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } < 0 {
            return Err(last_err());
        }
        // SAFETY: a shared mapping of our fd, length checked above; the result is checked.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(last_err());
        }
        Ok(Area {
            ptr: NonNull::new(p as *mut u8).expect("mmap returned non-null"),
            len,
            fd: std::sync::Mutex::new(Some(fd)),
            ino: st.st_ino,
            owned: true,
        })
    }

    /// An area over `len` bytes at `ptr` that are already a shared mapping of `fd` and stay
    /// mapped when the area is dropped (application memory moved onto a memfd).
    ///
    /// # Safety
    /// `ptr..ptr+len` must be a MAP_SHARED mapping of `fd` from offset 0 that is never
    /// unmapped while the area or a copy of its pointer is in use.
    pub(crate) unsafe fn adopt(ptr: NonNull<u8>, len: usize, fd: OwnedFd) -> Area {
        // SAFETY: fstat into a zeroed struct on the caller's fd.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        let ino = if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } == 0 {
            st.st_ino
        } else {
            0
        };
        Area {
            ptr,
            len,
            fd: std::sync::Mutex::new(Some(fd)),
            ino,
            owned: false,
        }
    }

    /// A duplicate of the memfd behind the area (to send to another process); fails once the
    /// fd was closed ([`Area::close_fd`], or an area mapped from another process's fd).
    pub fn dup_fd(&self) -> std::io::Result<OwnedFd> {
        let g = self.fd.lock().unwrap_or_else(|e| e.into_inner());
        match g.as_ref() {
            Some(fd) => fd.try_clone(),
            None => Err(std::io::Error::from_raw_os_error(libc::EBADF)),
        }
    }

    /// Closes the memfd (the mapping stays): nothing needs to send this area any more.
    pub fn close_fd(&self) {
        let mut g = self.fd.lock().unwrap_or_else(|e| e.into_inner());
        g.take();
    }

    /// Whether the area still holds its memfd.
    pub fn has_fd(&self) -> bool {
        self.fd.lock().unwrap_or_else(|e| e.into_inner()).is_some()
    }

    /// The memfd's inode number.
    pub fn inode(&self) -> u64 {
        self.ino
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

    /// Faults in the pages of `[off, off + len)` in this mapping, writable, as registering
    /// memory with an RNIC pins it (rxe: `ib_umem_get`): the first RDMA into a page then
    /// costs no page fault on the data path (a short transfer into fresh memory ran at half
    /// its steady rate, most of the difference page faults). The contents are untouched.
    /// Best effort: without `MADV_POPULATE_WRITE` (Linux < 5.14) each page is read once,
    /// which maps a shared memfd page writable too. Out of range: nothing.
    pub fn populate(&self, off: usize, len: usize) {
        // include/uapi/asm-generic/mman-common.h; not in the libc crate.
        const MADV_POPULATE_WRITE: libc::c_int = 23;
        let Some(end) = off.checked_add(len).filter(|e| *e <= self.len && len > 0) else {
            return;
        };
        // A larger MR is faulted in as it is used (this bounds the memory and the time one
        // registration costs the daemon).
        if len > POPULATE_MAX {
            return;
        }
        let start = off / PAGE * PAGE;
        // SAFETY: `start..end` lies in our mapping; madvise only faults pages in.
        let r = unsafe {
            libc::madvise(
                self.ptr.as_ptr().add(start) as *mut libc::c_void,
                end - start,
                MADV_POPULATE_WRITE,
            )
        };
        // Only a kernel without the advice (EINVAL) gets the page-by-page reads; after
        // another failure (ENOMEM) reading would only fault again.
        if r != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINVAL) {
            for p in (start..end).step_by(PAGE) {
                self.load_u8(p);
            }
        }
    }

    /// Reads one byte with acquire ordering (polling for an incoming RDMA WRITE).
    pub fn load_u8(&self, off: usize) -> u8 {
        assert!(off < self.len, "Area::load_u8 out of bounds");
        // SAFETY: in bounds; an AtomicU8 view of a byte is always valid.
        unsafe { (*(self.ptr.as_ptr().add(off) as *const AtomicU8)).load(Ordering::Acquire) }
    }

    /// A 4-byte-aligned atomic word at `off`.
    pub fn atomic_u32(&self, off: usize) -> Result<&std::sync::atomic::AtomicU32, MemoryError> {
        self.check(off, 4)?;
        if !(self.ptr.as_ptr() as usize + off).is_multiple_of(4) {
            return Err(MemoryError::Misaligned);
        }
        // SAFETY: in bounds and aligned; the area outlives the reference.
        Ok(unsafe { &*(self.ptr.as_ptr().add(off) as *const std::sync::atomic::AtomicU32) })
    }

    /// An 8-byte-aligned atomic word at `off`.
    pub fn atomic_u64(&self, off: usize) -> Result<&AtomicU64, MemoryError> {
        self.check(off, 8)?;
        if !(self.ptr.as_ptr() as usize + off).is_multiple_of(8) {
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

    fn read_summed(&self, off: usize, dst: &mut [u8], crc: &mut Icrc) -> Result<(), MemoryError> {
        self.check(off, dst.len())?;
        // SAFETY: in bounds (checked); the area lives as long as &self; each byte is loaded
        // once, so a concurrent write by the other side (the DMA model above) changes the
        // copy and the ICRC alike.
        unsafe { crc.copy_from_raw(dst, self.ptr.as_ptr().add(off)) };
        Ok(())
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
        if self.owned {
            // SAFETY: we mapped exactly this range and nobody holds a reference (Arc
            // dropped); the fd closes with `self.fd`.
            unsafe { libc::munmap(self.ptr.as_ptr() as *mut libc::c_void, self.len) };
        }
    }
}

/// Resident kB of this process's mapping that starts at `addr` (/proc/self/smaps `Rss`):
/// whether memory is faulted in (tests, diagnostics). `None` if no mapping starts there.
pub fn resident_kb(addr: u64) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/smaps").ok()?;
    let mut inside = false;
    for l in text.lines() {
        // A mapping's first line: "start-end perms ...".
        let start = l
            .split_once(' ')
            .and_then(|(range, _)| range.split_once('-'))
            .and_then(|(lo, _)| u64::from_str_radix(lo, 16).ok());
        if let Some(lo) = start {
            inside = lo == addr;
        } else if let Some(v) = l.strip_prefix("Rss:").filter(|_| inside) {
            return v.trim().trim_end_matches("kB").trim().parse().ok();
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn populate_faults_the_pages_in_and_keeps_the_contents() {
        let a = Area::new(1 << 20, "populate").unwrap();
        a.write_at(8192, b"kept").unwrap();
        let rss = || resident_kb(a.addr()).unwrap();
        assert!(rss() < 64, "{} kB before", rss());
        a.populate(100, (1 << 20) - 100);
        assert!(rss() >= 1024, "{} kB after", rss());
        let mut b = [0u8; 4];
        a.read_at(8192, &mut b).unwrap();
        assert_eq!(&b, b"kept");
        // Out of range: nothing, no fault.
        a.populate(1 << 20, 1);
        a.populate(usize::MAX, 2);
    }

    /// A packet's payload read out of an application's memory: the one-pass copy and ICRC
    /// (`read_summed`) gives what a copy and a separate CRC give, at every offset and length
    /// class, and nothing outside the area is read.
    #[test]
    fn reading_with_the_icrc_matches_reading_then_summing() {
        let a = Area::new(3 * 4096, "summed").unwrap();
        let bytes: Vec<u8> = (0..a.len()).map(|i| (i * 131 + i / 7) as u8).collect();
        a.write_at(0, &bytes).unwrap();
        for (off, n) in [
            (0, 64),
            (3, 511),
            (5, 512),
            (100, 4096),
            (7, 8192 + 77),
            (0, a.len()),
        ] {
            let mut fused = vec![0u8; n];
            let mut c = Icrc::new();
            c.update(b"headers");
            a.read_summed(off, &mut fused, &mut c).unwrap();
            let mut plain = vec![0u8; n];
            a.read_at(off, &mut plain).unwrap();
            let mut want = Icrc::new();
            want.update(b"headers");
            want.update(&plain);
            assert_eq!(fused, &bytes[off..off + n], "{off}+{n}");
            assert_eq!(c.finish(), want.finish(), "{off}+{n}");
        }
        let mut dst = vec![0u8; 4096];
        let mut c = Icrc::new();
        assert_eq!(
            a.read_summed(a.len() - 4095, &mut dst, &mut c),
            Err(MemoryError::OutOfBounds)
        );
    }

    #[test]
    fn area_memory_contract() {
        let a = Area::new(100, "test").unwrap();
        assert_eq!(a.addr() % 4096, 0, "page aligned");
        assert_eq!(a.len(), 4096, "whole pages");
        a.write_at(10, b"hello").unwrap();
        let mut b = [0u8; 5];
        a.read_at(10, &mut b).unwrap();
        assert_eq!(&b, b"hello");
        assert_eq!(a.load_u8(14), b'o');
        assert_eq!(a.write_at(4094, b"abc"), Err(MemoryError::OutOfBounds));
        assert_eq!(a.read_at(usize::MAX, &mut b), Err(MemoryError::OutOfBounds));
        assert_eq!(a.fetch_add(16, 5).unwrap(), 0);
        assert_eq!(a.compare_swap(16, 5, 9).unwrap(), 5);
        assert_eq!(a.fetch_add(17, 1), Err(MemoryError::Misaligned));
    }

    /// Another mapping of the same memfd sees the same bytes; a memfd that is not sealed
    /// against shrinking, or smaller than claimed, or a non-memfd, is refused.
    #[test]
    fn shared_mappings_and_untrusted_fds() {
        let a = Area::new(8192, "shared").unwrap();
        let dup = a.dup_fd().unwrap();
        let b = Area::from_fd(dup, 8192).unwrap();
        assert!(!b.has_fd(), "a received area keeps no descriptor");
        a.write_at(5000, b"same bytes").unwrap();
        let mut got = [0u8; 10];
        b.read_at(5000, &mut got).unwrap();
        assert_eq!(&got, b"same bytes");
        let dup = a.dup_fd().unwrap();
        assert!(
            Area::from_fd(dup, 3 * 4096).is_err(),
            "smaller than claimed"
        );
        let unsealed = Area::memfd(4096, "unsealed").unwrap();
        assert!(Area::from_fd(unsealed, 4096).is_err(), "not sealed");
        let file = std::fs::File::open("/proc/self/status").unwrap();
        assert!(Area::from_fd(file.into(), 4096).is_err(), "not a memfd");
        // The sealed area cannot be truncated by anyone holding its fd.
        let fd = a.dup_fd().unwrap();
        let r = unsafe { libc::ftruncate(fd.as_raw_fd(), 0) };
        assert!(r < 0);
        a.close_fd();
        assert!(a.dup_fd().is_err());
        a.write_at(0, b"still mapped").unwrap();
    }

    /// A hugetlb memfd - sealed, large enough - is refused: its pages can run out after the
    /// mapping and fault the reader (SIGBUS). Skipped where the kernel has no hugetlb pages
    /// to create one with.
    #[test]
    fn hugetlb_memfds_are_refused() {
        let name = std::ffi::CString::new("huge").unwrap();
        // SAFETY: valid name; the result is checked.
        let raw = unsafe {
            libc::memfd_create(
                name.as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING | libc::MFD_HUGETLB,
            )
        };
        if raw < 0 {
            eprintln!("no hugetlb memfd here: {}", std::io::Error::last_os_error());
            return;
        }
        // SAFETY: a fresh fd we own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // A hugetlb file's size is a multiple of the huge page size; 0 pages reserved is
        // fine for the check (the refusal comes before the size).
        unsafe {
            libc::ftruncate(fd.as_raw_fd(), 2 << 20);
            libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_SHRINK);
        }
        let e = Area::from_fd(fd, 4096).unwrap_err();
        assert!(e.to_string().contains("hugetlb"), "{e}");
    }
}
