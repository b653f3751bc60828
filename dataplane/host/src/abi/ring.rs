//! Single-producer/single-consumer rings of fixed-size slots in an [`Area`].
//!
//! Layout: the consumer index at byte 0, the producer index at byte 64 (separate cache lines),
//! slots from byte 128. Indices are free-running u64 counters; the producer publishes with a
//! release store, the consumer reads with acquire (and the other way round for free space).
//! Nothing inside the area is a pointer, and an index that claims more entries than the
//! capacity (a corrupted or hostile peer) is rejected rather than trusted.
//!
//! Notification (CQ rings, for blocking waits): the consumer arms the ring by storing 1 at
//! byte 16; a producer that pushes while armed disarms it, increments the 32-bit sequence
//! at byte 8 and wakes futex waiters on it (`FUTEX_WAKE`, never blocking: the producer makes
//! no system call on an fd the consumer controls). The consumer waits with `FUTEX_WAIT` on
//! the sequence - from any process that maps the ring.

use std::marker::PhantomData;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use crate::abi::area::Area;

/// Types that may live in a ring slot: plain data, `Copy`, no pointers or references, so a
/// slot's bytes mean the same in any address space - and valid for every bit pattern, since
/// the other side of a ring may be another process writing anything: `repr(C)` structs of
/// integers and byte arrays (no `bool`, `char`, enum, reference or `Option`).
///
/// # Safety
/// Implementors must contain no pointers, references or types with drop glue, and every bit
/// pattern of their size must be a valid value.
pub unsafe trait Plain: Copy + 'static {}

const HEAD: usize = 0;
const NOTIFY_SEQ: usize = 8;
const ARMED: usize = 16;
/// The ARMED word's value for a solicited-only arm (1: any entry).
const ARMED_SOLICITED: u64 = 2;
const TAIL: usize = 64;
const SLOTS: usize = 128;

/// Bytes an area needs for a ring of `capacity` slots of `T`.
pub fn ring_bytes<T: Plain>(capacity: usize) -> usize {
    SLOTS + capacity * std::mem::size_of::<T>()
}

fn idx(area: &Area, off: usize) -> &AtomicU64 {
    area.atomic_u64(off)
        .expect("ring header in bounds and aligned")
}

/// Creates a ring of `capacity` (a power of two) slots in a new shared area named `name`;
/// returns the area (to share) and both ends.
pub fn ring<T: Plain>(
    capacity: usize,
    name: &str,
) -> std::io::Result<(Arc<Area>, Producer<T>, Consumer<T>)> {
    assert!(
        capacity.is_power_of_two(),
        "ring capacity must be a power of two"
    );
    assert!(
        std::mem::align_of::<T>() <= 64,
        "slot alignment above a cache line"
    );
    let area = Arc::new(Area::new(ring_bytes::<T>(capacity), name)?);
    Ok((
        area.clone(),
        Producer::attach(area.clone(), capacity),
        Consumer::attach(area, capacity),
    ))
}

/// The producing end.
pub struct Producer<T: Plain> {
    area: Arc<Area>,
    cap: u64,
    tail: u64,
    /// The consumer's index as last read: the shared one is read again only when this one
    /// says the ring is full (rte_ring's and liburing's cached index), so a push does not
    /// pull the consumer's cache line every time.
    cached_head: u64,
    /// Entries written after `tail` and not yet published ([`Producer::stage`]).
    staged: u64,
    _t: PhantomData<*const T>,
}

/// The consuming end.
pub struct Consumer<T: Plain> {
    area: Arc<Area>,
    cap: u64,
    head: u64,
    /// The producer's index as last read (and checked): read again only when this one says
    /// the ring is empty.
    cached_tail: u64,
    /// Times the producer's index was implausible (corruption).
    pub rejected: u64,
    _t: PhantomData<*const T>,
}

// SAFETY: each end is used by one thread at a time; the area is Sync.
unsafe impl<T: Plain> Send for Producer<T> {}
// SAFETY: as Producer.
unsafe impl<T: Plain> Send for Consumer<T> {}

impl<T: Plain> Producer<T> {
    /// Attaches to a ring area as its producer.
    pub fn attach(area: Arc<Area>, capacity: usize) -> Producer<T> {
        let tail = idx(&area, TAIL).load(Ordering::Acquire);
        let cached_head = idx(&area, HEAD).load(Ordering::Acquire);
        Producer {
            area,
            cap: capacity as u64,
            tail,
            cached_head,
            staged: 0,
            _t: PhantomData,
        }
    }

    /// The ring's area.
    pub fn area(&self) -> &Arc<Area> {
        &self.area
    }

    /// After pushing: if the consumer armed the ring, disarms it, bumps the notification
    /// sequence and wakes its waiters; returns whether it did. `solicited`: whether what was
    /// pushed includes an entry that satisfies a solicited-only arm (IBA 11.4.2.2: a
    /// solicited completion or an unsuccessful one); a ring armed solicited-only stays armed
    /// through other entries.
    pub fn notify(&self, solicited: bool) -> bool {
        let Ok(armed) = self.area.atomic_u64(ARMED) else {
            return false;
        };
        // Store-load ordering with the consumer (Dekker): our TAIL store must be visible
        // before we read ARMED, as its ARMED store is before it reads TAIL; otherwise both
        // could miss the other and the consumer would sleep on a completion it never sees.
        std::sync::atomic::fence(Ordering::SeqCst);
        let mut cur = armed.load(Ordering::Acquire);
        loop {
            if cur == 0 || (cur == ARMED_SOLICITED && !solicited) {
                return false;
            }
            // The consumer may re-arm concurrently (any <-> solicited-only): take what is
            // there now.
            match armed.compare_exchange(cur, 0, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => break,
                Err(now) => cur = now,
            }
        }
        if let Ok(seq) = self.area.atomic_u32(NOTIFY_SEQ) {
            seq.fetch_add(1, Ordering::Release);
            // SAFETY: FUTEX_WAKE on a word of a live shared mapping; it never blocks.
            unsafe {
                libc::syscall(
                    libc::SYS_futex,
                    seq.as_ptr(),
                    libc::FUTEX_WAKE,
                    i32::MAX,
                    std::ptr::null::<libc::timespec>(),
                    std::ptr::null::<u32>(),
                    0,
                );
            }
        }
        true
    }

    /// Appends `v` and publishes it (with anything staged before it); false when full.
    #[inline]
    pub fn push(&mut self, v: &T) -> bool {
        if !self.stage(v) {
            return false;
        }
        self.publish();
        true
    }

    /// How many more entries fit after those staged, the consumer's index read again; as
    /// many [`Producer::stage`] calls then succeed, whatever the consumer writes meanwhile
    /// (they check against the index read here).
    pub fn room_left(&mut self) -> usize {
        self.cached_head = idx(&self.area, HEAD).load(Ordering::Acquire);
        let used = self.tail.wrapping_sub(self.cached_head);
        if used > self.cap {
            return 0;
        }
        (self.cap - used).saturating_sub(self.staged) as usize
    }

    /// How many entries the ring holds that the consumer has not taken (published or
    /// staged), by the consumer's index read now (a consumer's nonsense counts as full).
    pub fn held(&mut self) -> usize {
        self.cap as usize - self.room_left()
    }

    /// Whether `n` more entries fit after those staged, reading the consumer's index again
    /// only when the cached one says they do not.
    #[inline]
    pub fn room(&mut self, n: usize) -> bool {
        if self.fits(self.cached_head, n) {
            return true;
        }
        self.cached_head = idx(&self.area, HEAD).load(Ordering::Acquire);
        self.fits(self.cached_head, n)
    }

    /// Whether `n` more entries fit after those staged with the consumer at `head`. A
    /// consumer index past ours (a corrupted or hostile consumer) reads as a full ring.
    fn fits(&self, head: u64, n: usize) -> bool {
        let used = self.tail.wrapping_sub(head);
        used <= self.cap && self.cap - used >= self.staged + n as u64
    }

    /// Writes `v` after the entries staged so far without publishing it: the consumer sees
    /// every staged entry at once, at the next [`Producer::publish`] (several entries, one
    /// release store: a multi-cell post, or a batch). False when full.
    #[inline]
    pub fn stage(&mut self, v: &T) -> bool {
        if !self.room(1) {
            return false;
        }
        let slot = (self.tail.wrapping_add(self.staged) & (self.cap - 1)) as usize;
        // SAFETY: slot < cap and the area holds cap slots after SLOTS; T is plain data; the
        // consumer has freed this slot (room above) and does not read it until the release
        // store in `publish`.
        unsafe {
            let p = self
                .area
                .as_ptr()
                .add(SLOTS + slot * std::mem::size_of::<T>()) as *mut T;
            std::ptr::write_unaligned(p, *v);
        }
        self.staged += 1;
        true
    }

    /// Publishes the staged entries (one release store).
    #[inline]
    pub fn publish(&mut self) {
        if self.staged != 0 {
            self.tail = self.tail.wrapping_add(self.staged);
            self.staged = 0;
            idx(&self.area, TAIL).store(self.tail, Ordering::Release);
        }
    }
}

impl<T: Plain> Consumer<T> {
    /// Attaches to a ring area as its consumer.
    pub fn attach(area: Arc<Area>, capacity: usize) -> Consumer<T> {
        let head = idx(&area, HEAD).load(Ordering::Acquire);
        Consumer {
            area,
            cap: capacity as u64,
            head,
            cached_tail: head,
            rejected: 0,
            _t: PhantomData,
        }
    }

    /// The ring's area.
    pub fn area(&self) -> &Arc<Area> {
        &self.area
    }

    /// The notification sequence now (read it before arming, then wait for it to change).
    pub fn notify_seq(&self) -> u32 {
        self.area
            .atomic_u32(NOTIFY_SEQ)
            .map(|a| a.load(Ordering::Acquire))
            .unwrap_or(0)
    }

    /// Asks the producer to notify at its next push (`solicited_only`: at its next push of a
    /// solicited or unsuccessful entry, `ibv_req_notify_cq(cq, 1)`).
    pub fn arm(&self, solicited_only: bool) {
        if let Ok(a) = self.area.atomic_u64(ARMED) {
            let v = if solicited_only { ARMED_SOLICITED } else { 1 };
            // A solicited-only request does not narrow an arm for any entry already made
            // (verbs: the broader request stays in force until it fires).
            if solicited_only {
                let _ = a.compare_exchange(0, v, Ordering::AcqRel, Ordering::Acquire);
            } else {
                a.store(v, Ordering::Release);
            }
        }
        // Pairs with the fence in `Producer::notify`: the caller polls the ring after
        // arming, and must see any entry pushed by a producer that did not see the arm.
        std::sync::atomic::fence(Ordering::SeqCst);
    }

    /// Arms the ring for a consumer about to sleep and returns the word to wait on (with
    /// others, [`wait_any`]). The caller checks the ring is still empty afterwards: the arm's
    /// fence orders that check after the arm, so a push the check misses notifies.
    pub fn prepare_wait(&self) -> WaitWord {
        let seen = self.notify_seq();
        self.arm(false);
        WaitWord {
            word: self
                .area
                .atomic_u32(NOTIFY_SEQ)
                .map_or(std::ptr::null(), |a| a as *const AtomicU32),
            seen,
            shared: true,
            _area: Some(self.area.clone()),
        }
    }

    /// Waits until the notification sequence differs from `seen` or `timeout` passes
    /// (`None`: no limit); true if it changed.
    pub fn wait_notify(&self, seen: u32, timeout: Option<std::time::Duration>) -> bool {
        let Ok(seq) = self.area.atomic_u32(NOTIFY_SEQ) else {
            return false;
        };
        let deadline = timeout.map(|t| std::time::Instant::now() + t);
        loop {
            if seq.load(Ordering::Acquire) != seen {
                return true;
            }
            let ts = deadline.map(|d| {
                let left = d.saturating_duration_since(std::time::Instant::now());
                libc::timespec {
                    tv_sec: left.as_secs() as libc::time_t,
                    tv_nsec: left.subsec_nanos() as libc::c_long,
                }
            });
            if ts.is_some_and(|t| t.tv_sec == 0 && t.tv_nsec == 0) {
                return false;
            }
            let tsp = ts
                .as_ref()
                .map_or(std::ptr::null(), |t| t as *const libc::timespec);
            // SAFETY: FUTEX_WAIT on a word of a live shared mapping, with a valid or null
            // timeout; spurious wake-ups and EINTR loop back to the check.
            unsafe {
                libc::syscall(
                    libc::SYS_futex,
                    seq.as_ptr(),
                    libc::FUTEX_WAIT,
                    seen,
                    tsp,
                    std::ptr::null::<u32>(),
                    0,
                );
            }
        }
    }

    /// Entries waiting.
    pub fn len(&self) -> usize {
        let tail = idx(&self.area, TAIL).load(Ordering::Acquire);
        let n = tail.wrapping_sub(self.head);
        if n > self.cap {
            0
        } else {
            n as usize
        }
    }

    /// Whether nothing is waiting.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Takes the oldest entry.
    #[inline]
    pub fn pop(&mut self) -> Option<T> {
        if self.available() == 0 {
            return None;
        }
        let slot = (self.head & (self.cap - 1)) as usize;
        // SAFETY: the producer published this slot (acquire above); in bounds; plain data.
        let v = unsafe {
            let p = self
                .area
                .as_ptr()
                .add(SLOTS + slot * std::mem::size_of::<T>()) as *const T;
            std::ptr::read_unaligned(p)
        };
        self.head = self.head.wrapping_add(1);
        idx(&self.area, HEAD).store(self.head, Ordering::Release);
        Some(v)
    }

    /// A copy of the `i`-th entry not yet taken (0: the oldest), if it is published.
    #[inline]
    pub fn peek(&mut self, i: usize) -> Option<T> {
        if !self.ready(i + 1) {
            return None;
        }
        self.get(i)
    }

    /// Whether `n` entries are published and not yet taken, reading the producer's index
    /// again only when the cached one says there are fewer.
    #[inline]
    pub fn ready(&mut self, n: usize) -> bool {
        if self.cached_tail.wrapping_sub(self.head) >= n as u64 {
            return true;
        }
        self.cached_tail = self.head;
        self.available() >= n as u64
    }

    /// A copy of the `i`-th entry not yet taken, if [`Consumer::ready`] or
    /// [`Consumer::peek`] has seen it published.
    #[inline]
    pub fn get(&self, i: usize) -> Option<T> {
        if self.cached_tail.wrapping_sub(self.head) <= i as u64 {
            return None;
        }
        let slot = (self.head.wrapping_add(i as u64) & (self.cap - 1)) as usize;
        // SAFETY: the producer published this entry (acquire in `available`) and does not
        // touch it until HEAD moves past it; in bounds; plain data.
        Some(unsafe {
            let p = self
                .area
                .as_ptr()
                .add(SLOTS + slot * std::mem::size_of::<T>()) as *const T;
            std::ptr::read_unaligned(p)
        })
    }

    /// Entries published and not yet taken (the producer's index read again).
    pub fn published(&mut self) -> usize {
        self.cached_tail = self.head;
        self.available() as usize
    }

    /// Takes the `n` oldest entries (read with [`Consumer::peek`]) and hands their slots
    /// back to the producer (one release store). Only entries [`Consumer::ready`] or
    /// [`Consumer::peek`] has seen published are taken.
    #[inline]
    pub fn advance(&mut self, n: usize) {
        let n = (n as u64).min(self.cached_tail.wrapping_sub(self.head));
        if n > 0 {
            self.head = self.head.wrapping_add(n);
            idx(&self.area, HEAD).store(self.head, Ordering::Release);
        }
    }

    /// Entries published and not yet taken: from the cached producer index, read again (with
    /// acquire, and checked) only when that one says there are none. An implausible index
    /// (more than the ring holds: a corrupted or hostile producer) is counted in `rejected`
    /// and reads as none, so no garbage slot is ever read.
    fn available(&mut self) -> u64 {
        let n = self.cached_tail.wrapping_sub(self.head);
        if n != 0 {
            return n;
        }
        let tail = idx(&self.area, TAIL).load(Ordering::Acquire);
        let n = tail.wrapping_sub(self.head);
        if n > self.cap {
            self.rejected += 1;
            return 0;
        }
        self.cached_tail = tail;
        n
    }

    /// Pops up to `max` slots, handing each to `f` with its index as it is read from the ring,
    /// and publishes the new consumer index once at the end (one release store per batch,
    /// not per slot); returns how many.
    pub fn pop_each(&mut self, max: usize, mut f: impl FnMut(usize, &T)) -> usize {
        let n = (self.available() as usize).min(max);
        for i in 0..n {
            let slot = (self.head.wrapping_add(i as u64) & (self.cap - 1)) as usize;
            // SAFETY: the producer published these slots (acquire above) and does not touch
            // them until HEAD moves past them; in bounds; plain data.
            let v = unsafe {
                let p = self
                    .area
                    .as_ptr()
                    .add(SLOTS + slot * std::mem::size_of::<T>())
                    as *const T;
                std::ptr::read_unaligned(p)
            };
            f(i, &v);
        }
        if n > 0 {
            self.head = self.head.wrapping_add(n as u64);
            idx(&self.area, HEAD).store(self.head, Ordering::Release);
        }
        n
    }
}

/// A 32-bit futex word a sleeping consumer waits on, with the value it saw: a ring's
/// notification sequence (a shared mapping, kept mapped by the word) or a word of the
/// process's own memory that outlives the wait.
pub struct WaitWord {
    word: *const AtomicU32,
    seen: u32,
    shared: bool,
    _area: Option<Arc<Area>>,
}

impl WaitWord {
    /// A word in this process's own memory (woken with `FUTEX_WAKE_PRIVATE`), with the value
    /// the caller saw. The word must outlive the wait.
    pub fn private(word: &AtomicU32, seen: u32) -> WaitWord {
        WaitWord {
            word,
            seen,
            shared: false,
            _area: None,
        }
    }
}

/// Most words one `futex_waitv` call takes (the kernel's limit).
const MAX_WAITV: usize = 128;

/// Sleeps until one of `words` changes from the value it saw, or `timeout` passes: one
/// `futex_waitv` (Linux 5.16) over all of them. More words than the kernel takes, or a
/// kernel without the call, sleep the whole timeout instead (the waiters' producers then
/// wait for the sleeper's next look, as before there were wake-ups).
pub fn wait_any(words: &[WaitWord], timeout: std::time::Duration) {
    // include/uapi/linux/futex.h
    #[repr(C)]
    struct FutexWaitv {
        val: u64,
        uaddr: u64,
        flags: u32,
        reserved: u32,
    }
    const SYS_FUTEX_WAITV: libc::c_long = 449;
    const FUTEX2_SIZE_U32: u32 = 0x02;
    const FUTEX2_PRIVATE: u32 = 128;
    let live = words.iter().filter(|w| !w.word.is_null());
    if words.is_empty() || words.len() > MAX_WAITV {
        std::thread::sleep(timeout);
        return;
    }
    let mut v: [FutexWaitv; MAX_WAITV] = std::array::from_fn(|_| FutexWaitv {
        val: 0,
        uaddr: 0,
        flags: 0,
        reserved: 0,
    });
    let mut n = 0;
    for w in live {
        v[n] = FutexWaitv {
            val: w.seen as u64,
            uaddr: w.word as u64,
            flags: FUTEX2_SIZE_U32 | if w.shared { 0 } else { FUTEX2_PRIVATE },
            reserved: 0,
        };
        n += 1;
    }
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    let end = now.tv_nsec as u128 + now.tv_sec as u128 * 1_000_000_000 + timeout.as_nanos();
    let deadline = libc::timespec {
        tv_sec: (end / 1_000_000_000) as libc::time_t,
        tv_nsec: (end % 1_000_000_000) as libc::c_long,
    };
    // SAFETY: `v[..n]` are valid waiters on words of live mappings (kept by the callers'
    // WaitWords); the deadline is an absolute CLOCK_MONOTONIC time; the call only sleeps.
    let r = unsafe {
        libc::syscall(
            SYS_FUTEX_WAITV,
            v.as_ptr(),
            n as libc::c_uint,
            0 as libc::c_uint,
            &deadline as *const libc::timespec,
            libc::CLOCK_MONOTONIC,
        )
    };
    if r < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOSYS) {
        std::thread::sleep(timeout);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Copy, Debug, PartialEq, Default)]
    struct Slot {
        a: u64,
        b: [u32; 3],
    }
    // SAFETY: plain integers.
    unsafe impl Plain for Slot {}

    #[test]
    fn fifo_full_empty_and_wrap() {
        let (_, mut p, mut c) = ring::<Slot>(4, "t").unwrap();
        assert!(c.pop().is_none());
        for round in 0..10u64 {
            for i in 0..4 {
                assert!(p.push(&Slot {
                    a: round * 10 + i,
                    b: [i as u32; 3]
                }));
            }
            assert!(!p.push(&Slot::default()), "full");
            assert_eq!(c.len(), 4);
            for i in 0..4 {
                assert_eq!(c.pop().unwrap().a, round * 10 + i);
            }
            assert!(c.pop().is_none());
        }
    }

    /// Staged entries are invisible until published, then all at once; a reader peeks
    /// several entries before it takes them, across the ring's end.
    #[test]
    fn staged_entries_publish_together_and_are_peeked_before_taken() {
        let (_, mut p, mut c) = ring::<Slot>(8, "t").unwrap();
        let slot = |a| Slot { a, b: [0; 3] };
        let mut next = 0u64;
        for round in 0..10 {
            let n = 1 + round % 4;
            assert!(p.room(n));
            for _ in 0..n {
                assert!(p.stage(&slot(next)));
                next += 1;
            }
            assert!(c.peek(0).is_none(), "nothing published yet");
            assert!(!c.ready(1));
            p.publish();
            assert!(c.ready(n) && !c.ready(n + 1));
            for i in 0..n {
                assert_eq!(c.get(i).unwrap().a, next - (n - i) as u64);
            }
            assert!(c.get(n).is_none());
            c.advance(n);
            assert!(c.peek(0).is_none());
        }
        // Room counts what is staged: eight fit, a ninth does not.
        for i in 0..8 {
            assert!(p.stage(&slot(i)));
        }
        assert!(!p.room(1) && !p.stage(&slot(9)));
        p.publish();
        c.advance(3);
        assert!(!p.room(1), "entries not seen by the reader are not taken");
        assert!(c.ready(3));
        c.advance(3);
        assert!(p.room(3) && !p.room(4));
    }

    #[test]
    fn arms_notify_once_and_solicited_only_waits_for_a_solicited_entry() {
        let (_, p, c) = ring::<Slot>(4, "t").unwrap();
        assert!(!p.notify(true), "not armed");
        c.arm(false);
        assert!(p.notify(false), "armed for any entry");
        assert!(!p.notify(true), "disarmed by the notification");
        assert_eq!(c.notify_seq(), 1);
        c.arm(true);
        assert!(
            !p.notify(false),
            "solicited-only: an unsolicited entry does not notify"
        );
        assert!(p.notify(true), "a solicited (or failed) one does");
        assert_eq!(c.notify_seq(), 2);
        // A solicited-only request does not narrow an arm for any entry.
        c.arm(false);
        c.arm(true);
        assert!(p.notify(false));
        // Re-arming for any entry widens a solicited-only arm.
        c.arm(true);
        c.arm(false);
        assert!(p.notify(false));
        assert_eq!(c.notify_seq(), 4);
    }

    #[test]
    fn threads_and_corrupt_index() {
        let (area, mut p, mut c) = ring::<Slot>(64, "t").unwrap();
        let t = std::thread::spawn(move || {
            for i in 0..100_000u64 {
                while !p.push(&Slot { a: i, b: [0; 3] }) {
                    std::hint::spin_loop();
                }
            }
        });
        let mut next = 0;
        while next < 100_000 {
            if let Some(s) = c.pop() {
                assert_eq!(s.a, next);
                next += 1;
            }
        }
        t.join().unwrap();
        // A hostile producer index claiming more entries than slots is rejected.
        area.atomic_u64(TAIL)
            .unwrap()
            .store(u64::MAX / 2, Ordering::Release);
        assert!(c.pop().is_none());
        assert_eq!(c.rejected, 1);
        assert_eq!(c.len(), 0);
    }
}
