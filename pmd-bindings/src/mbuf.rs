//! Owned packet buffers (`rte_mbuf`), multi-segment chains and external buffers.

use std::ffi::c_void;
use std::ptr::NonNull;

use crate::error::{Error, Result};
use crate::sys;

/// `RTE_MBUF_F_EXTERNAL`: the data is an external buffer.
const MBUF_F_EXTERNAL: u64 = 1 << 61;
/// `RTE_MBUF_F_INDIRECT`: the data belongs to another mbuf.
const MBUF_F_INDIRECT: u64 = 1 << 62;

/// An owned packet mbuf (the head of a chain of one or more segments).
///
/// Dropping it returns every segment to its pool; sending it on a port consumes it. It is
/// `repr(transparent)` over the raw pointer, so bursts of `Mbuf`s are passed to DPDK as arrays
/// of `rte_mbuf *` without conversion.
#[repr(transparent)]
#[derive(Debug)]
pub struct Mbuf(NonNull<sys::rte_mbuf>);

// SAFETY: an Mbuf is exclusively owned; mbuf free/alloc are thread-safe pool operations.
unsafe impl Send for Mbuf {}
// SAFETY: shared references only read the buffer.
unsafe impl Sync for Mbuf {}

impl Mbuf {
    /// Takes ownership of a raw mbuf.
    ///
    /// # Safety
    /// `m` must be a valid mbuf (head of its chain) that nobody else frees or uses.
    #[inline]
    pub unsafe fn from_raw(m: *mut sys::rte_mbuf) -> Mbuf {
        // SAFETY: caller guarantees non-null validity.
        Mbuf(unsafe { NonNull::new_unchecked(m) })
    }

    /// Gives up ownership; the caller must free or send the mbuf.
    #[inline]
    pub fn into_raw(self) -> *mut sys::rte_mbuf {
        let p = self.0.as_ptr();
        std::mem::forget(self);
        p
    }

    /// The raw pointer, still owned by `self`.
    #[inline]
    pub fn as_ptr(&self) -> *mut sys::rte_mbuf {
        self.0.as_ptr()
    }

    #[inline]
    fn raw(&self) -> &sys::rte_mbuf {
        // SAFETY: we own a valid mbuf.
        unsafe { self.0.as_ref() }
    }

    /// Total packet length over all segments.
    #[inline]
    pub fn pkt_len(&self) -> usize {
        self.raw().pkt_len as usize
    }

    /// Whether the packet is empty.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.pkt_len() == 0
    }

    /// Length of the data in the first segment.
    #[inline]
    pub fn data_len(&self) -> usize {
        self.raw().data_len as usize
    }

    /// Bytes of buffer memory the packet holds: the buffer size of every segment, whatever
    /// part of it the data fills (what a frame costs a receive buffer counted in mbufs).
    #[inline]
    pub fn buffer_bytes(&self) -> usize {
        let mut n = 0;
        let mut m = self.0.as_ptr() as *const sys::rte_mbuf;
        while !m.is_null() {
            // SAFETY: `m` is a segment of the chain we own; `next` links it.
            unsafe {
                n += (*m).buf_len as usize;
                m = (*m).next;
            }
        }
        n
    }

    /// Number of segments in the chain.
    #[inline]
    pub fn nb_segs(&self) -> u16 {
        self.raw().nb_segs
    }

    /// The input port it was received on.
    #[inline]
    pub fn port(&self) -> u16 {
        self.raw().port
    }

    /// Reference count of the first segment.
    #[inline]
    pub fn refcnt(&self) -> u16 {
        // rte_mbuf_refcnt_read is a relaxed atomic load of the field; done here directly
        // because an FFI call per packet is measurable (pmd-bindings/benches).
        // SAFETY: valid mbuf; the u16 field is naturally aligned and only ever accessed
        // atomically by DPDK, so viewing it as an AtomicU16 is sound.
        unsafe {
            let p = std::ptr::addr_of_mut!((*self.0.as_ptr()).refcnt);
            (*(p as *const std::sync::atomic::AtomicU16)).load(std::sync::atomic::Ordering::Relaxed)
        }
    }

    /// Whether the first segment's data lives in an external buffer (or is an indirect view
    /// of another mbuf's data).
    #[inline]
    pub fn has_extbuf(&self) -> bool {
        self.raw().ol_flags & (MBUF_F_EXTERNAL | MBUF_F_INDIRECT) != 0
    }

    /// The first segment's data.
    #[inline]
    pub fn data(&self) -> &[u8] {
        let m = self.raw();
        // SAFETY: buf_addr + data_off points at data_len initialised bytes owned by this mbuf
        // (rte_pktmbuf_mtod); they live as long as &self.
        unsafe {
            std::slice::from_raw_parts(
                (m.buf_addr as *const u8).add(m.data_off as usize),
                m.data_len as usize,
            )
        }
    }

    /// The first segment's data, writable.
    ///
    /// # Panics
    /// If the data is shared: an external buffer attached to this mbuf, or a reference
    /// count above one (another mbuf may read the same bytes concurrently).
    #[inline]
    pub fn data_mut(&mut self) -> &mut [u8] {
        assert!(
            self.is_exclusive(),
            "Mbuf::data_mut on a shared buffer (external or refcnt > 1)"
        );
        let m = self.raw();
        let (addr, off, len) = (m.buf_addr as *mut u8, m.data_off, m.data_len);
        // SAFETY: as in data(); exclusivity checked above and guaranteed by &mut self.
        unsafe { std::slice::from_raw_parts_mut(addr.add(off as usize), len as usize) }
    }

    /// Whether the first segment's bytes are owned by this mbuf alone.
    #[inline]
    pub fn is_exclusive(&self) -> bool {
        self.refcnt() == 1 && !self.has_extbuf()
    }

    /// Bytes free before the data in the first segment.
    pub fn headroom(&self) -> usize {
        // SAFETY: valid mbuf.
        unsafe { sys::ferroce_pktmbuf_headroom(self.0.as_ptr()) as usize }
    }

    /// Bytes free after the data in the last segment.
    pub fn tailroom(&self) -> usize {
        // SAFETY: valid mbuf.
        unsafe { sys::ferroce_pktmbuf_tailroom(self.last_segment()) as usize }
    }

    fn last_segment(&self) -> *mut sys::rte_mbuf {
        let mut m = self.0.as_ptr();
        // SAFETY: walking a valid chain; `next` is NULL in the last segment.
        unsafe {
            while !(*m).next.is_null() {
                m = (*m).next;
            }
        }
        m
    }

    /// Grows the packet by `len` bytes at the end (of the last segment) and returns them
    /// (uninitialised contents: whatever the buffer held). `None` if the tailroom is too small.
    #[inline]
    pub fn append(&mut self, len: usize) -> Option<&mut [u8]> {
        let len16 = u16::try_from(len).ok()?;
        if !self.is_exclusive() {
            return None;
        }
        if self.raw().next.is_null() {
            // One segment: rte_pktmbuf_append's arithmetic, inline (no FFI per packet).
            // SAFETY: we own the mbuf exclusively; the new bytes lie within buf_len.
            unsafe {
                let m = self.0.as_mut();
                let end = m.data_off as usize + m.data_len as usize;
                if end + len > m.buf_len as usize {
                    return None;
                }
                m.data_len += len16;
                m.pkt_len += len as u32;
                let tail = (m.buf_addr as *mut u8).add(end);
                return Some(std::slice::from_raw_parts_mut(tail, len));
            }
        }
        // SAFETY: valid, exclusive mbuf; append returns NULL when there is no room.
        let p = unsafe { sys::ferroce_pktmbuf_append(self.0.as_ptr(), len16) };
        if p.is_null() {
            return None;
        }
        // SAFETY: DPDK reserved `len` bytes at p inside this mbuf's buffer.
        Some(unsafe { std::slice::from_raw_parts_mut(p as *mut u8, len) })
    }

    /// Appends a copy of `bytes`; `false` if it does not fit.
    pub fn extend_from_slice(&mut self, bytes: &[u8]) -> bool {
        match self.append(bytes.len()) {
            Some(dst) => {
                dst.copy_from_slice(bytes);
                true
            }
            None => false,
        }
    }

    /// Grows the packet by `len` bytes at the front and returns them. `None` if the headroom
    /// is too small.
    pub fn prepend(&mut self, len: usize) -> Option<&mut [u8]> {
        let len16 = u16::try_from(len).ok()?;
        if !self.is_exclusive() {
            return None;
        }
        // SAFETY: valid, exclusive mbuf; prepend returns NULL when there is no room.
        let p = unsafe { sys::ferroce_pktmbuf_prepend(self.0.as_ptr(), len16) };
        if p.is_null() {
            return None;
        }
        // SAFETY: DPDK moved data_off back by `len` bytes inside the buffer.
        Some(unsafe { std::slice::from_raw_parts_mut(p as *mut u8, len) })
    }

    /// Removes `len` bytes from the front of the first segment. `false` if it holds fewer.
    pub fn adj(&mut self, len: usize) -> bool {
        let Ok(len16) = u16::try_from(len) else {
            return false;
        };
        // SAFETY: valid mbuf; adj returns NULL (and changes nothing) when len > data_len.
        !unsafe { sys::ferroce_pktmbuf_adj(self.0.as_ptr(), len16) }.is_null()
    }

    /// Removes `len` bytes from the end of the last segment. `false` if it holds fewer.
    pub fn trim(&mut self, len: usize) -> bool {
        let Ok(len16) = u16::try_from(len) else {
            return false;
        };
        // SAFETY: valid mbuf; trim returns -1 (and changes nothing) when len is too large.
        unsafe { sys::ferroce_pktmbuf_trim(self.0.as_ptr(), len16) == 0 }
    }

    /// Appends `tail`'s segments to this chain. On failure (too many segments) `tail` is
    /// handed back untouched.
    pub fn chain(&mut self, tail: Mbuf) -> std::result::Result<(), Mbuf> {
        // SAFETY: both are valid heads we own; on success DPDK links tail into self's chain
        // and self owns it (freeing self frees tail).
        let ret = unsafe { sys::ferroce_pktmbuf_chain(self.0.as_ptr(), tail.as_ptr()) };
        if ret == 0 {
            std::mem::forget(tail);
            Ok(())
        } else {
            Err(tail)
        }
    }

    /// The data of every segment, in order.
    pub fn segments(&self) -> Segments<'_> {
        Segments {
            next: self.0.as_ptr(),
            _owner: std::marker::PhantomData,
        }
    }

    /// Copies the whole packet (all segments) into a new vector.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.pkt_len());
        for s in self.segments() {
            v.extend_from_slice(s);
        }
        v
    }

    /// Attaches an external buffer region as this mbuf's data: `len` bytes starting at
    /// `offset` in `ext`. The mbuf must be freshly allocated (no data, not chained). The
    /// region's reference count is raised; `ext`'s memory is released when the last mbuf
    /// referencing it and the `ExtBuf` itself have been dropped.
    pub fn attach_extbuf(&mut self, ext: &ExtBuf, offset: usize, len: usize) -> Result<()> {
        if offset.checked_add(len).is_none_or(|end| end > ext.len) {
            return Err(Error::InvalidArgument(format!(
                "extbuf region {offset}+{len} outside its {} bytes",
                ext.len
            )));
        }
        let len16 = u16::try_from(len)
            .map_err(|_| Error::InvalidArgument(format!("extbuf region of {len} bytes")))?;
        if self.nb_segs() != 1 || self.pkt_len() != 0 || !self.is_exclusive() {
            return Err(Error::InvalidArgument(
                "attach_extbuf needs an empty, unchained, unshared mbuf".into(),
            ));
        }
        // SAFETY: `ext.shinfo` is alive (we hold &ext); we take one more reference for this
        // mbuf before attaching, which detach/free will drop (calling the free callback when it
        // reaches zero). The region lies inside the buffer (checked above).
        unsafe {
            sys::ferroce_mbuf_ext_refcnt_update(ext.shinfo.as_ptr(), 1);
            let addr = ext.addr.add(offset);
            sys::ferroce_pktmbuf_attach_extbuf(
                self.0.as_ptr(),
                addr as *mut c_void,
                iova_of(addr),
                len16,
                ext.shinfo.as_ptr(),
            );
            // attach_extbuf sets data_off = 0, data_len = 0: expose the whole region.
            let m = self.0.as_mut();
            m.data_len = len16;
            m.pkt_len = len as u32;
        }
        Ok(())
    }
}

impl Drop for Mbuf {
    #[inline]
    fn drop(&mut self) {
        // SAFETY: we own the chain; rte_pktmbuf_free frees every segment (and detaches
        // external buffers, dropping their references).
        unsafe { sys::ferroce_pktmbuf_free(self.0.as_ptr()) }
    }
}

/// Iterator over the segments of an [`Mbuf`] chain.
pub struct Segments<'a> {
    next: *mut sys::rte_mbuf,
    _owner: std::marker::PhantomData<&'a Mbuf>,
}

impl<'a> Iterator for Segments<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        if self.next.is_null() {
            return None;
        }
        // SAFETY: `next` is a segment of a chain borrowed for 'a; its data region is valid.
        unsafe {
            let m = &*self.next;
            self.next = m.next;
            Some(std::slice::from_raw_parts(
                (m.buf_addr as *const u8).add(m.data_off as usize),
                m.data_len as usize,
            ))
        }
    }
}

fn iova_of(addr: *const u8) -> u64 {
    // With IOVA as VA (always the case with --no-huge) the IOVA is the address. In PA mode
    // memory outside DPDK's heap has no IOVA unless registered; virtual PMDs never use it.
    // SAFETY: rte_eal_iova_mode only reads EAL configuration.
    if unsafe { sys::rte_eal_iova_mode() } == sys::RTE_IOVA_VA {
        addr as u64
    } else {
        // SAFETY: rte_mem_virt2iova only translates the address.
        unsafe { sys::rte_mem_virt2iova(addr as *const c_void) }
    }
}

/// Memory outside DPDK's pools that mbufs can point at (`rte_pktmbuf_attach_extbuf`): the way
/// to send application memory without copying it.
///
/// Reference counted by DPDK's `rte_mbuf_ext_shared_info`: this handle holds one reference and
/// each attached mbuf another; when the count reaches zero the release callback runs (on the
/// thread that freed the last mbuf, which may be inside `rte_eth_tx_burst`'s completion path).
pub struct ExtBuf {
    shinfo: NonNull<sys::rte_mbuf_ext_shared_info>,
    addr: *mut u8,
    len: usize,
}

// SAFETY: the shared info is updated with atomic reference counting (RTE_MBUF_REFCNT_ATOMIC);
// the memory is only read through mbufs.
unsafe impl Send for ExtBuf {}
// SAFETY: see Send.
unsafe impl Sync for ExtBuf {}

/// The allocation behind an ExtBuf's shared info: DPDK's header first (its address is what
/// DPDK holds), then our release callback.
#[repr(C)]
struct ExtShared {
    shinfo: sys::rte_mbuf_ext_shared_info,
    release: Option<Box<dyn FnOnce() + Send>>,
}

unsafe extern "C" fn ext_free_cb(_addr: *mut c_void, opaque: *mut c_void) {
    // SAFETY: `opaque` is the Box<ExtShared> leaked in ExtBuf::from_raw_parts; DPDK calls this
    // exactly once, when the last reference is dropped.
    let shared = unsafe { Box::from_raw(opaque as *mut ExtShared) };
    let mut shared = shared;
    if let Some(release) = shared.release.take() {
        release();
    }
}

impl ExtBuf {
    /// Wraps `len` bytes at `addr`; `release` runs once the memory is no longer referenced.
    ///
    /// # Safety
    /// `addr..addr+len` must stay valid and unmodified by anyone else until `release` runs.
    pub unsafe fn from_raw_parts(
        addr: *mut u8,
        len: usize,
        release: Box<dyn FnOnce() + Send>,
    ) -> ExtBuf {
        let shared = Box::new(ExtShared {
            shinfo: sys::rte_mbuf_ext_shared_info {
                free_cb: Some(ext_free_cb),
                fcb_opaque: std::ptr::null_mut(),
                refcnt: 1,
            },
            release: Some(release),
        });
        let raw = Box::into_raw(shared);
        // SAFETY: raw is a valid, exclusively owned allocation; its first field is the shinfo.
        unsafe {
            (*raw).shinfo.fcb_opaque = raw as *mut c_void;
            ExtBuf {
                shinfo: NonNull::new_unchecked(raw as *mut sys::rte_mbuf_ext_shared_info),
                addr,
                len,
            }
        }
    }

    /// Takes ownership of a byte buffer; it is freed when the last mbuf referencing it is.
    pub fn from_vec(v: Vec<u8>) -> ExtBuf {
        let mut boxed = v.into_boxed_slice();
        let addr = boxed.as_mut_ptr();
        let len = boxed.len();
        let owner = SendBox(boxed);
        // SAFETY: the boxed slice is moved into the release closure, so it lives (at a stable
        // heap address, never touched by anyone else) until the release runs.
        unsafe { ExtBuf::from_raw_parts(addr, len, Box::new(move || drop(owner))) }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Current reference count (this handle plus attached mbufs).
    pub fn refcnt(&self) -> u16 {
        // SAFETY: shinfo alive while we hold a reference.
        unsafe { sys::ferroce_mbuf_ext_refcnt_update(self.shinfo.as_ptr(), 0) }
    }
}

struct SendBox(#[allow(dead_code)] Box<[u8]>);

impl Drop for ExtBuf {
    fn drop(&mut self) {
        // SAFETY: drop this handle's reference; when it was the last, run the callback as
        // DPDK would (it frees the ExtShared allocation).
        unsafe {
            if sys::ferroce_mbuf_ext_refcnt_update(self.shinfo.as_ptr(), -1) == 0 {
                ext_free_cb(
                    self.addr as *mut c_void,
                    self.shinfo.as_ptr() as *mut c_void,
                );
            }
        }
    }
}
