//! Zero-copy registration of ordinary application memory (malloc'd, anonymous mmap): the
//! pages of the range are moved onto a memfd mapped at the same virtual addresses - copy the
//! contents into the memfd, then map it over the range with MAP_FIXED | MAP_SHARED - so the
//! RNIC (in rnicd, another process) maps the same physical pages. This is the mechanism
//! FreeFlow (NSDI'19) uses for its shadow memory; ranges round out to whole pages.
//!
//! Only private read-write memory can move: anonymous, the heap, and private writable file
//! mappings (a program's .data and .bss, where static buffers live: their pages are the
//! process's own copies). Read-only file mappings, shared mappings, hugetlbfs pages, the stack,
//! and pages already moved as part of a different range are refused with a clear error naming
//! what to register instead.
//!
//! Moved ranges are process-wide ([`acquire`], [`release`]): every context of the process
//! (a second device, a second `ibv_open_device`) that registers within a moved range shares
//! its memfd, as multi-rail programs (UCX, MPI) register one buffer on two RNICs. When the
//! last registration within a range goes, the range becomes private anonymous memory again
//! with its contents, so `fork`, `MADV_DONTNEED`, `mremap` and `realloc` behave as the program
//! expects; and a `fork` child gets private copies of every moved range (a `pthread_atfork`
//! child handler), as it would of ordinary memory.
//!
//! Caveats, as with FreeFlow: a thread that writes the range while it moves (at the first
//! registration, and back at the last deregistration) may lose that write, since the copy
//! and the remap are not atomic with respect to other threads; and while a range is
//! registered its pages are a shared mapping (`MADV_DONTNEED` keeps their contents, `mremap`
//! growing them faults past the memfd's end).

use std::cell::UnsafeCell;
use std::collections::BTreeMap;
use std::io;
use std::os::fd::AsRawFd;
use std::ptr::NonNull;
use std::sync::Arc;

use crate::abi::area::{Area, PAGE};

/// One mapping of /proc/self/smaps.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Mapping {
    start: u64,
    end: u64,
    perms: String,
    inode: u64,
    path: String,
    kernel_page_kb: u64,
}

fn parse_smaps(text: &str) -> Vec<Mapping> {
    let mut out: Vec<Mapping> = Vec::new();
    for line in text.lines() {
        let mut f = line.split_whitespace();
        let Some(first) = f.next() else { continue };
        if let Some((a, b)) = first.split_once('-') {
            if let (Ok(start), Ok(end)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16)) {
                let perms = f.next().unwrap_or("").to_string();
                // offset, device, inode, then the path (which may contain spaces).
                let inode = f.nth(2).and_then(|i| i.parse().ok()).unwrap_or(0);
                let rest: Vec<&str> = f.collect();
                out.push(Mapping {
                    start,
                    end,
                    perms,
                    inode,
                    path: rest.join(" "),
                    kernel_page_kb: 4,
                });
                continue;
            }
        }
        if first == "KernelPageSize:" {
            if let (Some(m), Some(v)) = (out.last_mut(), f.next()) {
                m.kernel_page_kb = v.parse().unwrap_or(4);
            }
        }
    }
    out
}

/// The memfd name moved ranges get (it shows in /proc/PID/maps).
pub const SHADOW_NAME: &str = "ferroce-mr";

/// One moved range: its memfd area (mapped at the range's addresses) and how many
/// registrations, in any context of the process, lie within it.
struct Moved {
    end: u64,
    area: Arc<Area>,
    users: u32,
}

/// The moved ranges of this process by start address, behind a pthread mutex (not a std
/// one) so that the `pthread_atfork` handlers can hold it across `fork` and the child can
/// use it.
struct Registry {
    lock: UnsafeCell<libc::pthread_mutex_t>,
    map: UnsafeCell<BTreeMap<u64, Moved>>,
}

// SAFETY: `map` is only touched with `lock` held (`with_registry`, the fork handlers).
unsafe impl Sync for Registry {}

static REGISTRY: Registry = Registry {
    lock: UnsafeCell::new(libc::PTHREAD_MUTEX_INITIALIZER),
    map: UnsafeCell::new(BTreeMap::new()),
};

struct Unlock;

impl Drop for Unlock {
    fn drop(&mut self) {
        // SAFETY: locked by `with_registry`, on this thread.
        unsafe { libc::pthread_mutex_unlock(REGISTRY.lock.get()) };
    }
}

fn with_registry<R>(f: impl FnOnce(&mut BTreeMap<u64, Moved>) -> R) -> R {
    install_fork_handlers();
    // SAFETY: a statically initialised mutex; unlocked by the guard, also on unwind.
    unsafe { libc::pthread_mutex_lock(REGISTRY.lock.get()) };
    let _unlock = Unlock;
    // SAFETY: the lock is held; no reference escapes the closure.
    f(unsafe { &mut *REGISTRY.map.get() })
}

fn install_fork_handlers() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        extern "C" fn prepare() {
            // SAFETY: held across fork, released by `parent` or `child`.
            unsafe { libc::pthread_mutex_lock(REGISTRY.lock.get()) };
        }
        extern "C" fn parent() {
            // SAFETY: locked by `prepare` on this thread.
            unsafe { libc::pthread_mutex_unlock(REGISTRY.lock.get()) };
        }
        extern "C" fn child() {
            // The child's only thread; the parent's contexts are not the child's, so the
            // child keeps none of the moves: each range becomes a private copy.
            // SAFETY: `prepare` holds the lock (inherited); the map is ours alone here.
            unsafe {
                let map = std::mem::take(&mut *REGISTRY.map.get());
                for (start, m) in &map {
                    let _ = make_private(*start, m.end);
                }
                // The areas' other resources (fds, locks) may have been in use by threads
                // that do not exist here: leaked rather than dropped.
                std::mem::forget(map);
                libc::pthread_mutex_unlock(REGISTRY.lock.get());
            }
        }
        // SAFETY: plain function pointers with C ABI.
        unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
    });
}

/// Turns the pages `[start, end)` into private anonymous memory with the same contents: a
/// fresh anonymous mapping gets a copy, then replaces the range (`mremap` moves its pages
/// there in one step).
///
/// # Safety
/// The range must be mapped and readable; no other thread may write it meanwhile.
unsafe fn make_private(start: u64, end: u64) -> io::Result<()> {
    let len = (end - start) as usize;
    let tmp = libc::mmap(
        std::ptr::null_mut(),
        len,
        libc::PROT_READ | libc::PROT_WRITE,
        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
        -1,
        0,
    );
    if tmp == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    std::ptr::copy_nonoverlapping(start as *const u8, tmp as *mut u8, len);
    let p = libc::mremap(
        tmp,
        len,
        len,
        libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
        start as *mut libc::c_void,
    );
    if p == libc::MAP_FAILED {
        let e = io::Error::last_os_error();
        libc::munmap(tmp, len);
        return Err(e);
    }
    Ok(())
}

/// One more registration within `[start, end)` (page aligned): returns the moved range that
/// contains it - an existing one of any context of this process, or the range itself, whose
/// pages are moved now. A moved range that overlaps without containing it is refused while
/// registrations use it (they would lose the application's writes).
///
/// # Safety
/// As [`move_range`] when the pages move: no other thread may write the range meanwhile.
pub unsafe fn acquire(start: u64, end: u64) -> io::Result<(u64, Arc<Area>)> {
    with_registry(|map| {
        // Moves whose pages the application unmapped meanwhile (and maybe mapped something
        // else there) are not its memory any more: forgotten, without touching the pages.
        let near: Vec<u64> = map
            .range(..end)
            .filter(|(_, m)| m.end > start)
            .map(|(s, _)| *s)
            .collect();
        for s in near {
            if !still_mapped(&map[&s].area) {
                map.remove(&s);
            }
        }
        if let Some((s, m)) = map.range_mut(..=start).next_back() {
            if m.end >= end {
                m.users += 1;
                return Ok((*s, m.area.clone()));
            }
        }
        let used: Vec<(u64, u64)> = map.iter().map(|(s, m)| (*s, m.end)).collect();
        let area = Arc::new(move_range_outside(start, end, &used)?);
        map.insert(
            start,
            Moved {
                end,
                area: area.clone(),
                users: 1,
            },
        );
        Ok((start, area))
    })
}

/// A registration within the moved range `area` is gone. With the last one, the range
/// becomes private anonymous memory again, contents kept (unless the application unmapped
/// it meanwhile).
///
/// # Safety
/// No other thread may write the range during the call (its pages may move back).
pub unsafe fn release(area: &Arc<Area>) {
    with_registry(|map| {
        let start = area.addr();
        let Some(m) = map.get_mut(&start).filter(|m| Arc::ptr_eq(&m.area, area)) else {
            return; // forgotten already (its pages were unmapped)
        };
        m.users = m.users.saturating_sub(1);
        if m.users > 0 {
            return;
        }
        let m = map.remove(&start).expect("present");
        if still_mapped(&m.area) {
            if let Err(e) = make_private(start, m.end) {
                tracing::warn!(error = %e, "registered pages could not become private again");
            }
        }
    })
}

/// How many registrations use the moved range starting at `start` (0: none, not moved).
pub fn users(start: u64) -> u32 {
    with_registry(|map| map.get(&start).map_or(0, |m| m.users))
}

/// Why `[start, end)` cannot move, if it cannot. Pages of earlier moves may move again
/// unless they overlap a range in `used` (moves that registrations still use).
fn refusal(maps: &[Mapping], start: u64, end: u64, used: &[(u64, u64)]) -> Option<String> {
    let mut covered = start;
    for m in maps.iter().filter(|m| m.end > start && m.start < end) {
        if m.start > covered {
            return Some(format!("{covered:#x}..{:#x} is not mapped", m.start));
        }
        covered = covered.max(m.end);
        let (lo, hi) = (m.start.max(start), m.end.min(end));
        let reusable = !used.iter().any(|&(s, e)| s < hi && lo < e);
        let what = if m.path.contains(SHADOW_NAME) && reusable {
            None
        } else if m.path.contains(SHADOW_NAME) {
            Some(
                "its pages were already moved for another registration, still registered, \
                  that does not contain this range (register within it, or disjoint from it)"
                    .to_string(),
            )
        } else if m.kernel_page_kb != 4 || m.path.contains("anon_hugepage") {
            Some(format!(
                "it is hugetlbfs memory ({} kB pages), which cannot move onto a memfd",
                m.kernel_page_kb
            ))
        } else if m.perms.ends_with('s') {
            Some(format!(
                "it is a shared mapping ({})",
                display_path(&m.path)
            ))
        } else if m.path.starts_with('[') && m.path != "[heap]" {
            Some(format!("it is {}", m.path))
        } else if !m.path.is_empty() && m.path != "[heap]" && !m.perms.starts_with("rw") {
            // A private writable file mapping (a program's .data and .bss, static buffers)
            // moves like anonymous memory: its pages are the process's own copies. A
            // read-only one (code, constants) is the file's.
            Some(format!(
                "it is a read-only file-backed mapping of {} ({})",
                m.path, m.perms
            ))
        } else if !m.perms.starts_with("rw") {
            Some(format!("it is not read-write ({})", m.perms))
        } else {
            None
        };
        if let Some(w) = what {
            return Some(format!(
                "memory at {:#x}..{:#x} cannot be registered in place: {w}; register memory \
                 from malloc or a private anonymous mmap (or the RNIC's own buffers: \
                 ferroce_alloc_buf in C, Verbs::alloc_buffer in Rust)",
                m.start.max(start),
                m.end.min(end)
            ));
        }
    }
    (covered < end).then(|| format!("{covered:#x}..{end:#x} is not mapped"))
}

fn display_path(p: &str) -> &str {
    if p.is_empty() {
        "anonymous"
    } else {
        p
    }
}

/// Whether `area`'s pages are still its memfd's mapping in this process (the application
/// may have unmapped them - a large free, heap trimming - and mapped something else there).
pub fn still_mapped(area: &Area) -> bool {
    let ino = area.inode();
    let (start, end) = (area.addr(), area.addr() + area.len() as u64);
    let Ok(text) = std::fs::read_to_string("/proc/self/smaps") else {
        return false;
    };
    let maps = parse_smaps(&text);
    let mut covered = start;
    for m in maps.iter().filter(|m| m.end > start && m.start < end) {
        if m.start > covered || m.inode != ino || !m.path.contains(SHADOW_NAME) {
            return false;
        }
        covered = m.end;
    }
    covered >= end
}

/// The page-aligned range holding `[addr, addr + len)`.
pub fn page_range(addr: u64, len: usize) -> Option<(u64, u64)> {
    let start = addr & !(PAGE as u64 - 1);
    let end = addr
        .checked_add(len as u64)?
        .checked_next_multiple_of(PAGE as u64)?;
    (len > 0).then_some((start, end))
}

/// Moves the pages `[start, end)` (page aligned) of this process onto a new sealed memfd
/// mapped at the same addresses, keeping their contents; returns the area over them (which
/// leaves them mapped when dropped). Pages of earlier moves are refused while a registration
/// uses them ([`acquire`]). Registrations go through [`acquire`], which shares moves between
/// contexts and counts their users; this is the bare move.
///
/// # Safety
/// No other thread may write the range during the call, and nothing may rely on the pages'
/// previous private mapping (e.g. other references obtained from `mremap`).
pub unsafe fn move_range(start: u64, end: u64) -> io::Result<Area> {
    let used: Vec<(u64, u64)> = with_registry(|map| map.iter().map(|(s, m)| (*s, m.end)).collect());
    move_range_outside(start, end, &used)
}

/// [`move_range`], refusing pages of the registered moves `used`.
unsafe fn move_range_outside(start: u64, end: u64, used: &[(u64, u64)]) -> io::Result<Area> {
    let len = (end - start) as usize;
    let smaps = std::fs::read_to_string("/proc/self/smaps")?;
    if let Some(why) = refusal(&parse_smaps(&smaps), start, end, used) {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, why));
    }
    let fd = Area::memfd(len, SHADOW_NAME)?;
    // Copy the current contents into the memfd.
    let mut done = 0usize;
    while done < len {
        // SAFETY: the source range is mapped and readable (checked above).
        let r = libc::pwrite(
            fd.as_raw_fd(),
            (start as usize + done) as *const libc::c_void,
            len - done,
            done as libc::off_t,
        );
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        done += r as usize;
    }
    if libc::fcntl(
        fd.as_raw_fd(),
        libc::F_ADD_SEALS,
        libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL,
    ) < 0
    {
        return Err(io::Error::last_os_error());
    }
    // Replace the pages: the same addresses now show the memfd, with the copied contents.
    let p = libc::mmap(
        start as *mut libc::c_void,
        len,
        libc::PROT_READ | libc::PROT_WRITE,
        libc::MAP_SHARED | libc::MAP_FIXED,
        fd.as_raw_fd(),
        0,
    );
    if p == libc::MAP_FAILED || p as u64 != start {
        return Err(io::Error::last_os_error());
    }
    Ok(Area::adopt(
        NonNull::new(start as *mut u8).expect("non-null range"),
        len,
        fd,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smaps_are_parsed_and_refusals_name_the_reason() {
        let text = "\
7f0000000000-7f0000002000 rw-p 00000000 00:00 0 
KernelPageSize:        4 kB
7f0000002000-7f0000003000 rw-p 00000000 00:00 0                          [heap]
KernelPageSize:        4 kB
7f0000003000-7f0000004000 r--p 00000000 08:01 1234                       /usr/lib/libc.so.6
KernelPageSize:        4 kB
7f0000004000-7f0000005000 rw-s 00000000 00:01 99                         /memfd:ferroce-mr (deleted)
KernelPageSize:        4 kB
7f0000006000-7f0000206000 rw-p 00000000 00:0f 5                          /anon_hugepage (deleted)
KernelPageSize:     2048 kB
7f0000206000-7f0000207000 rw-s 00000000 00:01 7                          /dev/zero (deleted)
KernelPageSize:        4 kB
";
        let m = parse_smaps(text);
        assert_eq!(m.len(), 6);
        assert_eq!(m[3].path, "/memfd:ferroce-mr (deleted)");
        assert_eq!(m[4].kernel_page_kb, 2048);
        let base = 0x7f00_0000_0000u64;
        assert_eq!(
            refusal(&m, base, base + 0x3000, &[]),
            None,
            "anonymous + heap move"
        );
        let why = |s: u64, e: u64| refusal(&m, base + s, base + e, &[]).unwrap();
        assert!(why(0x3000, 0x4000).contains("read-only file-backed mapping of /usr/lib/libc.so.6"));
        // An earlier move moves again unless a registration uses it.
        assert_eq!(refusal(&m, base + 0x4000, base + 0x5000, &[]), None);
        let used = [(base + 0x4800, base + 0x6000)];
        assert!(refusal(&m, base + 0x4000, base + 0x5000, &used)
            .unwrap()
            .contains("already moved"));
        assert!(why(0x5000, 0x6000).contains("not mapped"));
        assert!(why(0x6000, 0x7000).contains("hugetlbfs"));
        assert!(why(0x206000, 0x207000).contains("shared mapping"));
        assert!(why(0x206000, 0x208000).contains("shared mapping"));
        assert!(refusal(&m, base + 0x207000, base + 0x208000, &[])
            .unwrap()
            .contains("not mapped"));
    }

    #[test]
    fn moved_pages_keep_their_contents_and_are_the_memfds() {
        // An anonymous private mapping with data in it.
        let len = 3 * PAGE;
        // SAFETY: a fresh anonymous mapping, unmapped at the end.
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
        assert_ne!(p, libc::MAP_FAILED);
        let s = unsafe { std::slice::from_raw_parts_mut(p as *mut u8, len) };
        for (i, b) in s.iter_mut().enumerate() {
            *b = (i * 7) as u8;
        }
        let (start, end) = page_range(p as u64 + 100, PAGE).unwrap();
        assert_eq!((start, end), (p as u64, p as u64 + 2 * PAGE as u64));
        // SAFETY: nothing else touches the range.
        let (base, area) = unsafe { acquire(start, end) }.unwrap();
        assert_eq!(base, start);
        assert!(
            s.iter().enumerate().all(|(i, b)| *b == (i * 7) as u8),
            "contents kept"
        );
        // Another mapping of the memfd (what rnicd does) sees the same bytes both ways.
        let fd = area.dup_fd().unwrap();
        let other = Area::from_fd(fd, 2 * PAGE).unwrap();
        s[5000] = 0xab;
        let mut b = [0u8; 1];
        other.read_at(5000, &mut b).unwrap();
        assert_eq!(b[0], 0xab);
        other.write_at(17, &[0xcd]).unwrap();
        assert_eq!(s[17], 0xcd);
        drop(other);
        // A registration within it (another context) shares the move.
        // SAFETY: as above.
        let (base2, area2) = unsafe { acquire(start + PAGE as u64, end) }.unwrap();
        assert_eq!(base2, start);
        assert!(Arc::ptr_eq(&area, &area2));
        assert_eq!(users(start), 2);
        // While a registration uses them, moving the pages again as part of a larger range
        // is refused.
        let again = unsafe { acquire(start, start + 3 * PAGE as u64) };
        assert!(again.unwrap_err().to_string().contains("already moved"));
        // SAFETY: nothing else touches the range.
        unsafe { release(&area2) };
        assert!(still_mapped(&area), "one registration left");
        // The last one: the pages are private anonymous memory again, contents kept.
        unsafe { release(&area) };
        assert_eq!(users(start), 0);
        assert!(!still_mapped(&area));
        assert_eq!((s[0], s[17], s[5000]), (0, 0xcd, 0xab));
        drop((area, area2));
        // MADV_DONTNEED on private anonymous pages gives zeroes (on a memfd it would not).
        // SAFETY: our pages.
        assert_eq!(unsafe { libc::madvise(p, PAGE, libc::MADV_DONTNEED) }, 0);
        assert_eq!(s[17], 0, "private again");
        // They move again, as part of a larger range, contents kept, onto a new memfd.
        s[17] = 0xcd;
        let (_, again) = unsafe { acquire(start, start + 3 * PAGE as u64) }
            .expect("a released move moves again");
        assert_eq!(
            (s[17], s[5000], s[100]),
            (0xcd, 0xab, 0),
            "page 0 was dropped"
        );
        assert_eq!(s[3 * PAGE - 1], ((3 * PAGE - 1) * 7) as u8);
        let fd = again.dup_fd().unwrap();
        let other = Area::from_fd(fd, 3 * PAGE).unwrap();
        other.write_at(3 * PAGE - 1, &[0x5a]).unwrap();
        assert_eq!(
            s[3 * PAGE - 1],
            0x5a,
            "the new memfd is the application's memory"
        );
        drop(other);
        // SAFETY: nothing else touches the range.
        unsafe { release(&again) };
        // SAFETY: our mapping.
        unsafe { libc::munmap(p, len) };
    }
}
