//! Memory behind memory regions, and the MR table with its keys, protection domains and
//! access checks.
//!
//! The engine never touches application memory directly: it goes through the [`Memory`]
//! trait, which the dataplane implements over its mappings (shared memory between processes
//! later) and which [`HeapMemory`] implements safely for tests and simulations.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::types::{Lkey, Rkey};
use crate::verbs::Access;
use crate::wire::icrc::Icrc;

/// Why a memory access was refused by the backing itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum MemoryError {
    /// Outside the backing.
    #[error("access outside the memory")]
    OutOfBounds,
    /// An atomic on an address that is not 8-byte aligned.
    #[error("atomic on a misaligned address")]
    Misaligned,
}

/// Memory that memory regions point into.
///
/// Contract for implementations:
/// * every method checks `offset..offset+len` against [`Memory::len`] and returns
///   [`MemoryError::OutOfBounds`] rather than touching anything outside;
/// * [`Memory::write`] stores bytes in ascending address order and makes the last byte
///   visible last (applications such as `ib_write_lat` poll the last byte of a buffer to detect
///   an incoming RDMA WRITE);
/// * the atomics are real CPU atomics on the target memory (two workers, or an application and
///   a worker, may operate on one address), on the value in host byte order; the offset must be
///   8-byte aligned.
pub trait Memory: Send + Sync {
    /// Length in bytes.
    fn len(&self) -> usize;

    /// Whether it is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Copies `dst.len()` bytes at `offset` into `dst`.
    fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), MemoryError>;

    /// As [`Memory::read`], also feeding the bytes to `icrc` (a packet being built). A backing
    /// that can hand out its bytes in place overrides it with [`Icrc::copy_from_raw`], which
    /// reads each byte once for both.
    fn read_summed(&self, off: usize, dst: &mut [u8], crc: &mut Icrc) -> Result<(), MemoryError> {
        self.read(off, dst)?;
        crc.update(dst);
        Ok(())
    }

    /// Copies `src` to `offset` (ascending, last byte last).
    fn write(&self, offset: usize, src: &[u8]) -> Result<(), MemoryError>;

    /// Atomically: `old = *p; if old == compare { *p = swap }; old`.
    fn compare_swap(&self, offset: usize, compare: u64, swap: u64) -> Result<u64, MemoryError>;

    /// Atomically: `old = *p; *p = old + add; old` (wrapping).
    fn fetch_add(&self, offset: usize, add: u64) -> Result<u64, MemoryError>;
}

fn check(len: usize, offset: usize, n: usize) -> Result<(), MemoryError> {
    match offset.checked_add(n) {
        Some(end) if end <= len => Ok(()),
        _ => Err(MemoryError::OutOfBounds),
    }
}

/// Heap memory made of 64-bit atomic words: safe to share between threads, with real CPU
/// atomics for RDMA ATOMIC operations. Byte accesses touch whole words with relaxed loads and
/// compare-exchange merges, so concurrent writers of different bytes of one word never lose
/// each other's data.
pub struct HeapMemory {
    words: Box<[AtomicU64]>,
    len: usize,
}

impl std::fmt::Debug for HeapMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HeapMemory({} bytes)", self.len)
    }
}

impl HeapMemory {
    /// `len` zero bytes.
    pub fn new(len: usize) -> HeapMemory {
        let words = (0..len.div_ceil(8)).map(|_| AtomicU64::new(0)).collect();
        HeapMemory { words, len }
    }

    /// A shared handle to `len` zero bytes.
    pub fn shared(len: usize) -> Arc<HeapMemory> {
        Arc::new(HeapMemory::new(len))
    }

    /// Memory initialised with `bytes`.
    pub fn from_bytes(bytes: &[u8]) -> HeapMemory {
        let m = HeapMemory::new(bytes.len());
        m.write(0, bytes).expect("in bounds");
        m
    }

    /// A copy of `len` bytes at `offset` (panics if out of bounds: for tests).
    pub fn to_vec(&self, offset: usize, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        self.read(offset, &mut v)
            .expect("HeapMemory::to_vec in bounds");
        v
    }

    /// Fills the whole memory with `byte`.
    pub fn fill(&self, byte: u8) {
        let w = u64::from_ne_bytes([byte; 8]);
        for x in self.words.iter() {
            x.store(w, Ordering::Relaxed);
        }
    }
}

impl Memory for HeapMemory {
    fn len(&self) -> usize {
        self.len
    }

    fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), MemoryError> {
        check(self.len, offset, dst.len())?;
        let mut pos = offset;
        let mut out = 0;
        while out < dst.len() {
            let w = self.words[pos / 8].load(Ordering::Acquire).to_ne_bytes();
            let within = pos % 8;
            let n = (8 - within).min(dst.len() - out);
            dst[out..out + n].copy_from_slice(&w[within..within + n]);
            out += n;
            pos += n;
        }
        Ok(())
    }

    fn write(&self, offset: usize, src: &[u8]) -> Result<(), MemoryError> {
        check(self.len, offset, src.len())?;
        let mut pos = offset;
        let mut inp = 0;
        while inp < src.len() {
            let within = pos % 8;
            let n = (8 - within).min(src.len() - inp);
            let word = &self.words[pos / 8];
            if n == 8 {
                let v = u64::from_ne_bytes(src[inp..inp + 8].try_into().expect("8 bytes"));
                word.store(v, Ordering::Release);
            } else {
                // Merge the bytes into the word without disturbing its other bytes.
                let mut cur = word.load(Ordering::Relaxed);
                loop {
                    let mut b = cur.to_ne_bytes();
                    b[within..within + n].copy_from_slice(&src[inp..inp + n]);
                    match word.compare_exchange_weak(
                        cur,
                        u64::from_ne_bytes(b),
                        Ordering::Release,
                        Ordering::Relaxed,
                    ) {
                        Ok(_) => break,
                        Err(x) => cur = x,
                    }
                }
            }
            inp += n;
            pos += n;
        }
        Ok(())
    }

    fn compare_swap(&self, offset: usize, compare: u64, swap: u64) -> Result<u64, MemoryError> {
        check(self.len, offset, 8)?;
        if !offset.is_multiple_of(8) {
            return Err(MemoryError::Misaligned);
        }
        let w = &self.words[offset / 8];
        Ok(
            match w.compare_exchange(compare, swap, Ordering::AcqRel, Ordering::Acquire) {
                Ok(v) | Err(v) => v,
            },
        )
    }

    fn fetch_add(&self, offset: usize, add: u64) -> Result<u64, MemoryError> {
        check(self.len, offset, 8)?;
        if !offset.is_multiple_of(8) {
            return Err(MemoryError::Misaligned);
        }
        Ok(self.words[offset / 8].fetch_add(add, Ordering::AcqRel))
    }
}

/// A protection domain handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct PdId(pub u32);

/// A reference to one registration of a memory region: its key and the registration
/// number the table gave it. State that outlives a single packet (a multi-packet WRITE being
/// placed, a READ being answered, a payload segment waiting to be gathered) holds this rather
/// than a bare key, and resolves it with [`MrTable::resolve`] at every use: a key whose index
/// and key byte come back for a later registration (the slot reused after `dereg_mr`, or a
/// fast-registration MR re-bound) has another registration number, so the old reference can
/// never reach the new region's memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MrRef {
    /// The local key at the time of the reference.
    pub lkey: Lkey,
    /// The registration number ([`MemoryRegion::reg`]).
    pub reg: u64,
}

/// The two kinds of memory window (IBA 10.6.7): type 1 is bound with `ibv_bind_mw` and used
/// by any QP of its PD; type 2 is bound by a work request and only the QP that bound it may
/// be addressed through it (type 2B: rxe's and ferroce's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum MwType {
    /// Type 1.
    One,
    /// Type 2 (2B).
    Two,
}

/// What makes a table entry a memory window rather than an MR. A window shares the MRs' key
/// space (one rkey lookup for both); its entry's `pd` is the window's, and while it is bound
/// (`valid`) its `access`, `addr`, `length`, `mem` and `mem_offset` describe the window's
/// range of the MR it is bound to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// Type.
    pub ty: MwType,
    /// Type 2: the QP it is bound to.
    pub qp: Option<crate::types::Qpn>,
    /// The MR it is bound to (while bound with a length).
    pub mr: Option<MrRef>,
}

/// A registered memory region.
#[derive(Clone)]
pub struct MemoryRegion {
    /// Registration number: unique among every registration the table ever held (never
    /// reused; a fast-registration re-bind takes a new one).
    pub reg: u64,
    /// Protection domain.
    pub pd: PdId,
    /// Local key.
    pub lkey: Lkey,
    /// Remote key (`None` without remote access).
    pub rkey: Option<Rkey>,
    /// Access rights.
    pub access: Access,
    /// First address (the application's virtual address, or 0 for zero-based).
    pub addr: u64,
    /// Length in bytes.
    pub length: u64,
    /// The memory.
    pub mem: Arc<dyn Memory>,
    /// Offset of `addr` within `mem`.
    pub mem_offset: usize,
    /// Allocated for fast registration (re-bound by REG_MR work requests).
    pub fast_reg: bool,
    /// False after invalidation (LOCAL_INV / SEND with invalidate) until re-registered; for a
    /// window, false while it is not bound (a type 2 window's FREE state).
    pub valid: bool,
    /// `Some` for a memory window (IBA 10.6.7), `None` for an MR.
    pub window: Option<Window>,
    /// An MR: how many windows are bound to it (it cannot be deregistered or re-registered
    /// meanwhile, IBA 10.6.7.2.6).
    pub windows: u32,
}

impl std::fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("pd", &self.pd)
            .field("lkey", &self.lkey)
            .field("rkey", &self.rkey)
            .field("access", &self.access)
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("length", &self.length)
            .field("valid", &self.valid)
            .finish()
    }
}

impl MemoryRegion {
    /// An entry of the key table for protection domain `pd` under `lkey` over `mem`, empty
    /// until its creator sets what it is: valid, no remote key, no access, no range, neither
    /// fast-registration nor a window, first registration.
    pub fn blank(pd: PdId, lkey: Lkey, mem: Arc<dyn Memory>) -> MemoryRegion {
        MemoryRegion {
            reg: 0,
            pd,
            lkey,
            rkey: None,
            access: Access(0),
            addr: 0,
            length: 0,
            mem,
            mem_offset: 0,
            fast_reg: false,
            valid: true,
            window: None,
            windows: 0,
        }
    }

    /// A reference to this registration.
    pub fn as_ref(&self) -> MrRef {
        MrRef {
            lkey: self.lkey,
            reg: self.reg,
        }
    }

    /// Offset into the backing memory of `addr..addr+len`, if the range lies in the region.
    pub fn offset_of(&self, addr: u64, len: u64) -> Option<usize> {
        let end = addr.checked_add(len)?;
        if addr < self.addr || end > self.addr + self.length {
            return None;
        }
        Some(self.mem_offset + (addr - self.addr) as usize)
    }
}

/// Why a key did not grant an access. Each maps to one completion status or NAK.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyError {
    /// No such key (never registered, deregistered, stale key byte or invalidated).
    BadKey,
    /// The MR belongs to another protection domain.
    WrongPd,
    /// The MR does not grant the access.
    Access,
    /// The range is outside the MR.
    Bounds,
}

#[derive(Default)]
struct Slot {
    /// Key byte of the current (or last) registration.
    key: u8,
    /// Whether the index waits in the free list (at most once: a table that also takes
    /// indices by [`MrTable::insert_at`] would otherwise queue one index again and again).
    queued: bool,
    mr: Option<MemoryRegion>,
}

/// How many freed indices wait before the oldest is reused ([`MrTable`]).
pub const MR_QUARANTINE: usize = 1024;

/// Memory regions by key. The upper 24 bits of a key index the table; the low 8 bits change on
/// every registration of that index (the rxe/mlx5 key layout; rxe draws the byte at random,
/// mlx5 from a per-device counter, ferroce counts per index so a key comes back only after
/// 256 registrations of its index). Indices are handed out least recently freed first (a FIFO
/// of free indices), and a freed index is reused only once [`MR_QUARANTINE`] others have been
/// freed after it: a key comes back after at least 256 x 1024 deregistrations, while the table
/// holds no more slots than its peak of live regions plus the quarantine (rxe's sparse pool
/// holds what is live; a table that used every index once before reusing one grew, one slot
/// per registration, to its maximum - 1 MiB per RNIC - which the real soak saw as memory
/// creeping up).
///
/// Keys alone are not identities: a key can come back. Every registration also gets a
/// registration number that is never reused, and anything that refers to a region beyond one
/// packet holds an [`MrRef`] (key and number) resolved with [`MrTable::resolve`], which also
/// checks the protection domain and validity: a stale reference fails instead of reaching
/// whichever region now has the key.
#[derive(Default)]
pub struct MrTable {
    slots: Vec<Slot>,
    /// Freed indices, oldest first.
    free: std::collections::VecDeque<u32>,
    /// The registration number the next registration gets.
    next_reg: u64,
    count: usize,
    max: usize,
}

impl MrTable {
    /// A table holding at most `max` regions.
    pub fn new(max: usize) -> MrTable {
        MrTable {
            slots: Vec::new(),
            free: std::collections::VecDeque::new(),
            next_reg: 1,
            count: 0,
            max,
        }
    }

    /// Number of live regions.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether no region is registered.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Inserts a region built by `make(lkey)`; returns its lkey, or `None` when full.
    pub fn insert(&mut self, make: impl FnOnce(Lkey) -> MemoryRegion) -> Option<Lkey> {
        if self.count >= self.max {
            return None;
        }
        // Index 0 is never used, so that key 0 is always invalid. Indices run 1..=max (at
        // most 2^24 - 1: the index is the key's upper 24 bits). A freed index is taken again
        // once the quarantine is full; otherwise a new one, while there are new ones.
        let fresh = self.slots.len().max(1);
        let idx = if self.free.len() > MR_QUARANTINE || fresh > self.max || fresh >= 1 << 24 {
            // An index taken meanwhile by `insert_at` is passed over.
            loop {
                let i = self.free.pop_front()?;
                let slot = &mut self.slots[i as usize];
                slot.queued = false;
                if slot.mr.is_none() {
                    break i;
                }
            }
        } else {
            self.slots.resize_with(fresh + 1, Slot::default);
            fresh as u32
        };
        let key = self.slots[idx as usize].key.wrapping_add(1);
        Some(self.fill(Lkey((idx << 8) | key as u32), make))
    }

    /// Inserts a region under exactly `lkey` (a replica of a registration another table
    /// chose the key of: an RNIC spread over several workers, docs/ARCHITECTURE.md);
    /// `None` if the index is in use or out of range, or the table is full.
    pub fn insert_at(
        &mut self,
        lkey: Lkey,
        make: impl FnOnce(Lkey) -> MemoryRegion,
    ) -> Option<Lkey> {
        let idx = lkey.index() as usize;
        if self.count >= self.max || idx == 0 || idx >= 1 << 24 {
            return None;
        }
        if idx >= self.slots.len() {
            // Indices skipped over are free for `insert` (every index below the end is in
            // use or queued).
            let from = self.slots.len().max(1);
            self.slots.resize_with(idx + 1, Slot::default);
            for i in from..idx {
                self.slots[i].queued = true;
                self.free.push_back(i as u32);
            }
        }
        if self.slots[idx].mr.is_some() {
            return None;
        }
        Some(self.fill(lkey, make))
    }

    /// Stores the region `make` builds under `lkey` (its index free), with a new
    /// registration number.
    fn fill(&mut self, lkey: Lkey, make: impl FnOnce(Lkey) -> MemoryRegion) -> Lkey {
        let reg = self.take_reg();
        let slot = &mut self.slots[lkey.index() as usize];
        slot.key = lkey.0 as u8;
        let mut mr = make(lkey);
        mr.reg = reg;
        slot.mr = Some(mr);
        self.count += 1;
        lkey
    }

    /// A new registration number (for a fast-registration re-bind).
    pub fn take_reg(&mut self) -> u64 {
        let r = self.next_reg;
        self.next_reg += 1;
        r
    }

    /// The region `r` refers to, if that very registration is still there, valid and in
    /// `pd`: the check of every use of a reference held across packets.
    pub fn resolve(&self, r: MrRef, pd: PdId) -> Option<&MemoryRegion> {
        self.get(r.lkey)
            .filter(|m| m.valid && m.reg == r.reg && m.pd == pd)
    }

    /// The memory of the registration `r` refers to, valid or not (the transmit path: a
    /// payload segment is gathered in the same worker step that checked it).
    pub fn memory_of(&self, r: MrRef) -> Option<&Arc<dyn Memory>> {
        self.get(r.lkey).filter(|m| m.reg == r.reg).map(|m| &m.mem)
    }

    /// Removes the region with this exact lkey.
    pub fn remove(&mut self, lkey: Lkey) -> Option<MemoryRegion> {
        let idx = lkey.index() as usize;
        let slot = self.slots.get_mut(idx)?;
        match &slot.mr {
            Some(mr) if mr.lkey == lkey => {
                self.count -= 1;
                if !slot.queued {
                    slot.queued = true;
                    self.free.push_back(idx as u32);
                }
                slot.mr.take()
            }
            _ => None,
        }
    }

    /// The region whose lkey is exactly `lkey` (valid or not).
    pub fn get(&self, lkey: Lkey) -> Option<&MemoryRegion> {
        let mr = self.slots.get(lkey.index() as usize)?.mr.as_ref()?;
        (mr.lkey == lkey).then_some(mr)
    }

    /// Mutable access by the MR's index (for invalidation and fast registration, which
    /// change the key byte).
    pub fn get_mut_by_index(&mut self, index: u32) -> Option<&mut MemoryRegion> {
        self.slots.get_mut(index as usize)?.mr.as_mut()
    }

    /// Checks a local access (an SGE): key, PD, access and bounds. Returns the MR and the
    /// offset into its memory.
    pub fn check_local(
        &self,
        lkey: Lkey,
        pd: PdId,
        addr: u64,
        len: u64,
        need: Access,
    ) -> Result<(&MemoryRegion, usize), KeyError> {
        // A window has no local key: its key names it only for remote access.
        let mr = self
            .get(lkey)
            .filter(|m| m.valid && m.window.is_none())
            .ok_or(KeyError::BadKey)?;
        if mr.pd != pd {
            return Err(KeyError::WrongPd);
        }
        if !mr.access.contains(need) {
            return Err(KeyError::Access);
        }
        let off = mr.offset_of(addr, len).ok_or(KeyError::Bounds)?;
        Ok((mr, off))
    }

    /// Checks a remote access (RETH / AtomicETH) of the QP `qpn`: the rkey must name a valid
    /// MR or bound memory window in the QP's PD (rxe's lookup rule: the tenant-isolation
    /// boundary) that grants `need` over the range. A window's own access and range count
    /// (not its MR's), a type 2 window only serves the QP it is bound to, and the MR under a
    /// window must still be valid (rxe_lookup_mw; the range is checked against the window,
    /// which rxe does not).
    pub fn check_remote(
        &self,
        rkey: Rkey,
        pd: PdId,
        qpn: crate::types::Qpn,
        va: u64,
        len: u64,
        need: Access,
    ) -> Result<(&MemoryRegion, usize), KeyError> {
        let mr = self
            .slots
            .get(rkey.index() as usize)
            .and_then(|s| s.mr.as_ref())
            .filter(|m| m.valid && m.rkey == Some(rkey))
            .ok_or(KeyError::BadKey)?;
        if mr.pd != pd {
            return Err(KeyError::WrongPd);
        }
        if let Some(w) = &mr.window {
            if w.ty == MwType::Two && w.qp != Some(qpn) {
                return Err(KeyError::BadKey);
            }
            let under =
                w.mr.and_then(|r| self.get(r.lkey).filter(|m| m.reg == r.reg));
            if !under.is_some_and(|m| m.valid) {
                return Err(KeyError::BadKey);
            }
        }
        if !mr.access.contains(need) {
            return Err(KeyError::Access);
        }
        let off = mr.offset_of(va, len).ok_or(KeyError::Bounds)?;
        Ok((mr, off))
    }

    /// The entry at `index`, whatever its key byte.
    pub fn by_index(&self, index: u32) -> Option<&MemoryRegion> {
        self.slots.get(index as usize)?.mr.as_ref()
    }

    /// The type 2 windows bound to the QP `qpn`.
    pub fn windows_of(&self, qpn: crate::types::Qpn) -> impl Iterator<Item = &MemoryRegion> {
        self.slots.iter().filter_map(move |s| {
            s.mr.as_ref()
                .filter(|m| m.window.is_some_and(|w| w.qp == Some(qpn)))
        })
    }

    /// Number of regions in a PD.
    pub fn count_in_pd(&self, pd: PdId) -> usize {
        self.slots
            .iter()
            .filter(|s| s.mr.as_ref().is_some_and(|m| m.pd == pd))
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heap_memory_bytes_and_atomics() {
        let m = HeapMemory::new(20);
        m.write(3, &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]).unwrap();
        assert_eq!(m.to_vec(0, 14), [0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 0]);
        assert_eq!(m.write(15, &[0; 6]), Err(MemoryError::OutOfBounds));
        assert_eq!(
            m.read(usize::MAX, &mut [0; 2]),
            Err(MemoryError::OutOfBounds)
        );
        assert_eq!(m.fetch_add(3, 1), Err(MemoryError::Misaligned));
        let z = HeapMemory::new(16);
        assert_eq!(z.fetch_add(8, 5).unwrap(), 0);
        assert_eq!(z.compare_swap(8, 5, 9).unwrap(), 5);
        assert_eq!(z.compare_swap(8, 5, 1).unwrap(), 9);
        let mut b = [0u8; 8];
        z.read(8, &mut b).unwrap();
        assert_eq!(u64::from_ne_bytes(b), 9);
        assert_eq!(z.fetch_add(16, 1), Err(MemoryError::OutOfBounds));
    }

    /// A replica table takes the keys it is given, refuses one in use, and a key removed
    /// and taken again any number of times queues its index once; a table mixing both
    /// passes over an index `insert_at` took.
    #[test]
    fn keys_given_to_a_replica_table() {
        let mem: Arc<dyn Memory> = HeapMemory::shared(64);
        let blank = |l| MemoryRegion::blank(PdId(1), l, mem.clone());
        let mut t = MrTable::new(8);
        let k = Lkey((5 << 8) | 7);
        assert_eq!(t.insert_at(k, blank), Some(k));
        assert_eq!(t.get(k).map(|m| m.lkey), Some(k));
        assert_eq!(t.insert_at(Lkey((5 << 8) | 8), blank), None, "index in use");
        assert_eq!(t.insert_at(Lkey(7), blank), None, "index 0 is never a key");
        for _ in 0..10_000 {
            assert!(t.remove(k).is_some());
            assert_eq!(t.insert_at(k, blank), Some(k));
        }
        assert_eq!(
            t.free.len(),
            5,
            "indices 1 to 4 skipped over, and 5 queued once"
        );
        // The allocator's own keys skip index 5 while it is taken.
        for _ in 0..7 {
            let l = t.insert(blank).expect("room");
            assert_ne!(l.index(), 5);
        }
        assert_eq!(t.len(), 8);
        assert_eq!(t.insert_at(Lkey((6 << 8) | 1), blank), None, "full");
    }

    #[test]
    fn concurrent_atomics_are_real() {
        let m = HeapMemory::shared(8);
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let m = m.clone();
                std::thread::spawn(move || {
                    for _ in 0..10_000 {
                        m.fetch_add(0, 1).unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(m.fetch_add(0, 0).unwrap(), 40_000);
    }

    const Q: crate::types::Qpn = crate::types::Qpn::new(0x11);

    fn region(pd: u32, lkey: Lkey, access: Access) -> MemoryRegion {
        MemoryRegion {
            rkey: access.any_remote().then_some(Rkey(lkey.0)),
            access,
            addr: 0x1000,
            length: 0x100,
            ..MemoryRegion::blank(PdId(pd), lkey, HeapMemory::shared(0x100))
        }
    }

    #[test]
    fn keys_change_on_reregistration_and_checks_are_ordered() {
        let mut t = MrTable::new(4);
        let a = t
            .insert(|k| region(1, k, Access::LOCAL_WRITE | Access::REMOTE_WRITE))
            .unwrap();
        assert_eq!(a.index(), 1);
        let ra = Rkey(a.0);
        assert!(t
            .check_remote(ra, PdId(1), Q, 0x1000, 0x100, Access::REMOTE_WRITE)
            .is_ok());
        assert_eq!(
            t.check_remote(ra, PdId(2), Q, 0x1000, 1, Access::REMOTE_WRITE)
                .unwrap_err(),
            KeyError::WrongPd
        );
        assert_eq!(
            t.check_remote(ra, PdId(1), Q, 0x1000, 1, Access::REMOTE_READ)
                .unwrap_err(),
            KeyError::Access
        );
        assert_eq!(
            t.check_remote(ra, PdId(1), Q, 0x10ff, 2, Access::REMOTE_WRITE)
                .unwrap_err(),
            KeyError::Bounds
        );
        assert_eq!(
            t.check_remote(ra, PdId(1), Q, u64::MAX, 2, Access::REMOTE_WRITE)
                .unwrap_err(),
            KeyError::Bounds
        );
        t.remove(a).unwrap();
        let b = t.insert(|k| region(1, k, Access::REMOTE_WRITE)).unwrap();
        assert_ne!(b.index(), a.index(), "a freed index waits for its turn");
        assert_eq!(
            t.check_remote(ra, PdId(1), Q, 0x1000, 1, Access::REMOTE_WRITE)
                .unwrap_err(),
            KeyError::BadKey,
            "the stale key fails"
        );
        assert!(t.check_local(Lkey(0), PdId(1), 0, 0, Access(0)).is_err());
        let l = t.insert(|k| region(1, k, Access::LOCAL_WRITE)).unwrap();
        t.remove(b).unwrap();
        t.remove(l).unwrap();
        // Indices 1..=4 are used in turn; index 1 comes back with a new key byte.
        let mut keys = Vec::new();
        for _ in 0..4 {
            let k = t.insert(|k| region(1, k, Access::LOCAL_WRITE)).unwrap();
            keys.push(k);
            t.remove(k).unwrap();
        }
        let again = keys.iter().find(|k| k.index() == a.index()).unwrap();
        assert_ne!(*again, a, "the same index with a new key byte");
        let l = t.insert(|k| region(1, k, Access::LOCAL_WRITE)).unwrap();
        assert!(t.get(l).unwrap().rkey.is_none());
        assert_eq!(
            t.check_remote(Rkey(l.0), PdId(1), Q, 0x1000, 1, Access(0))
                .unwrap_err(),
            KeyError::BadKey,
            "no rkey without remote access"
        );
    }

    /// Registrations that come and go keep the table at its peak of live regions plus the
    /// quarantine, and a freed index waits for 1024 others to be freed before it is reused.
    #[test]
    fn the_table_grows_with_live_regions_not_with_registrations() {
        let mut t = MrTable::new(1 << 20);
        let mut live = std::collections::VecDeque::new();
        let mut freed_at: std::collections::HashMap<u32, usize> = Default::default();
        let mut frees = 0usize;
        for _ in 0..50_000 {
            let k = t.insert(|k| region(1, k, Access::LOCAL_WRITE)).unwrap();
            if let Some(at) = freed_at.get(&k.index()) {
                assert!(
                    frees - at >= MR_QUARANTINE,
                    "index {} reused too soon",
                    k.index()
                );
            }
            live.push_back(k);
            if live.len() > 4 {
                let old = live.pop_front().unwrap();
                t.remove(old).unwrap();
                frees += 1;
                freed_at.insert(old.index(), frees);
            }
        }
        assert!(
            t.slots.len() <= 1 + 5 + MR_QUARANTINE + 1,
            "{} slots for 5 live regions",
            t.slots.len()
        );
    }
}
