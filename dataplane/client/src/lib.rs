//! libferroce_client: the C API of `include/ferroce.h` over rnicd's host interface
//! ([`ferroce_host::app::remote`]). Every function checks its pointers and handles, returns an errno
//! instead of panicking, and keeps a description of the last failure per context.
//!
//! The `repr(C)` structs here are the header's; `tests/abi.rs` compiles a C program against
//! the header and checks every size and offset against them.

#![allow(clippy::missing_safety_doc)] // the safety contract of each function is the header's

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ferroce_host::abi::slots::{CqeSlot, EventSlot};
use ferroce_host::app::remote::{connect, RemoteContext};
use ferroce_host::{Buffer, Mr, Verbs};
use roce::engine::{CqId, QpInit, SrqAttr, SrqId, VerbsError};
use roce::memory::PdId;
use roce::types::{Gid, Lkey, Qkey, Qpn, Rkey};
use roce::verbs::ibv::IbvError;
use roce::verbs::{
    ibv, Access, AddressVector, QpAttr, QpCaps, QpType, RecvWr, SendFlags, SendWr, Sge, UdDest,
    WrOp,
};

/// `struct ferroce_device_attr`.
#[repr(C)]
#[allow(missing_docs)]
pub struct DeviceAttr {
    pub fw_ver: [c_char; 64],
    pub max_mr_size: u64,
    pub vendor_id: u32,
    pub vendor_part_id: u32,
    pub max_qp: u32,
    pub max_qp_wr: u32,
    pub max_sge: u32,
    pub max_cq: u32,
    pub max_cqe: u32,
    pub max_mr: u32,
    pub max_pd: u32,
    pub max_srq: u32,
    pub max_srq_wr: u32,
    pub max_srq_sge: u32,
    pub max_inline_data: u32,
    pub max_qp_rd_atom: u32,
    pub max_qp_init_rd_atom: u32,
    pub atomic_cap: u32,
}

/// `struct ferroce_port_attr`.
#[repr(C)]
#[allow(missing_docs)]
pub struct PortAttr {
    pub state: u32,
    pub max_mtu: u32,
    pub active_mtu: u32,
    pub gid_tbl_len: u32,
    pub pkey_tbl_len: u32,
    pub link_layer: u32,
}

/// `struct ferroce_mr`.
#[repr(C)]
#[allow(missing_docs)]
pub struct CMr {
    pub addr: u64,
    pub length: u64,
    pub lkey: u32,
    pub rkey: u32,
}

/// `struct ferroce_srq_attr`.
#[repr(C)]
#[allow(missing_docs)]
pub struct CSrqAttr {
    pub max_wr: u32,
    pub max_sge: u32,
    pub srq_limit: u32,
}

/// `struct ferroce_qp_cap`.
#[repr(C)]
#[derive(Clone, Copy)]
#[allow(missing_docs)]
pub struct CQpCap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

/// `struct ferroce_qp_init_attr`.
#[repr(C)]
#[allow(missing_docs)]
pub struct CQpInit {
    pub pd: u32,
    pub send_cq: u32,
    pub recv_cq: u32,
    pub srq: u32,
    pub use_srq: u32,
    pub qp_type: u32,
    pub cap: CQpCap,
    pub sq_sig_all: u32,
}

/// `struct ferroce_ah_attr`.
#[repr(C)]
#[derive(Clone, Copy)]
#[allow(missing_docs)]
pub struct CAh {
    pub dgid: [u8; 16],
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
    pub sl: u8,
    pub dmac: [u8; 6],
    pub has_dmac: u8,
    pub reserved: u8,
}

/// `struct ferroce_qp_attr`.
#[repr(C)]
#[allow(missing_docs)]
pub struct CQpAttr {
    pub qp_state: u32,
    pub cur_qp_state: u32,
    pub path_mtu: u32,
    pub qp_access_flags: u32,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub ah_attr: CAh,
    pub pkey_index: u16,
    pub port_num: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub en_sqd_async_notify: u8,
    pub reserved: [u8; 2],
    pub cap: CQpCap,
}

/// `struct ferroce_sge`.
#[repr(C)]
#[derive(Clone, Copy)]
#[allow(missing_docs)]
pub struct CSge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// `struct ferroce_send_wr`.
#[repr(C)]
#[allow(missing_docs)]
pub struct CSendWr {
    pub wr_id: u64,
    pub sg_list: *const CSge,
    pub num_sge: u32,
    pub opcode: u32,
    pub send_flags: u32,
    pub imm_data: u32,
    pub remote_addr: u64,
    pub rkey: u32,
    pub bind_lkey: u32,
    pub compare_add: u64,
    pub swap: u64,
    pub ah: *const CAh,
    pub remote_qpn: u32,
    pub remote_qkey: u32,
}

/// `struct ferroce_recv_wr`.
#[repr(C)]
#[allow(missing_docs)]
pub struct CRecvWr {
    pub wr_id: u64,
    pub sg_list: *const CSge,
    pub num_sge: u32,
    pub reserved: u32,
}

/// `struct ferroce_wc` is [`CqeSlot`]; `struct ferroce_async_event` is [`EventSlot`].
pub type CWc = CqeSlot;
/// `struct ferroce_async_event`.
pub type CEvent = EventSlot;

/// Most SGEs one WR carries through this API.
const MAX_SGE: usize = ferroce_host::abi::slots::MAX_HOST_SGE;

/// A completion channel: an eventfd written once per CQ notification by a thread that
/// sleeps on the CQ ring's futex.
struct EventChannel {
    fd: OwnedFd,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for EventChannel {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// `struct ferroce_context`.
pub struct Context {
    ctx: RemoteContext,
    last_error: CString,
    buffers: HashMap<u64, Buffer>,
    mrs: HashMap<u32, Mr>,
    channels: HashMap<u32, EventChannel>,
}

thread_local! {
    static OPEN_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns this thread's errno.
    unsafe { *libc::__errno_location() = e };
}

fn errno_of(e: &VerbsError) -> c_int {
    // The same mapping rnicd's replies use.
    ferroce_host::abi::proto::WireError::from(e).errno()
}

/// Why a call failed: a verbs error (rnicd's, or the client's checks), or an argument this
/// library refused, with the errno and the text to report.
enum Fail {
    Verbs(VerbsError),
    Refused(c_int, String),
}

impl From<VerbsError> for Fail {
    fn from(e: VerbsError) -> Self {
        Fail::Verbs(e)
    }
}

/// An ibv-numbered argument (opcode, attribute mask) refused: EOPNOTSUPP for what ferroce
/// does not implement, else EINVAL.
impl From<IbvError> for Fail {
    fn from(e: IbvError) -> Self {
        let n = if e.is_unsupported() {
            libc::EOPNOTSUPP
        } else {
            libc::EINVAL
        };
        Fail::Refused(n, e.to_string())
    }
}

impl Context {
    fn fail(&mut self, e: c_int, msg: impl Into<String>) -> c_int {
        self.last_error = CString::new(msg.into().replace('\0', "?")).unwrap_or_default();
        set_errno(e);
        e
    }

    /// Reports `f`: its errno, and its text as the last error.
    fn failed(&mut self, f: impl Into<Fail>) -> c_int {
        match f.into() {
            Fail::Verbs(e) => self.fail(errno_of(&e), e.to_string()),
            Fail::Refused(n, msg) => self.fail(n, msg),
        }
    }

    fn done<T, E: Into<Fail>>(&mut self, r: Result<T, E>, f: impl FnOnce(&mut Self, T)) -> c_int {
        match r {
            Ok(v) => {
                f(self, v);
                0
            }
            Err(e) => self.failed(e),
        }
    }
}

/// Runs `f` on a context, with null pointers and panics turned into errors.
fn with_ctx(ctx: *mut Context, f: impl FnOnce(&mut Context) -> c_int) -> c_int {
    if ctx.is_null() {
        set_errno(libc::EINVAL);
        return libc::EINVAL;
    }
    // SAFETY: the caller passes a context from ferroce_open, used by one thread at a time.
    let c = unsafe { &mut *ctx };
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(c))) {
        Ok(r) => r,
        Err(_) => c.fail(libc::EFAULT, "internal error (panic) in libferroce_client"),
    }
}

/// Checks an out/in pointer argument.
fn nonnull<T>(p: *const T, what: &str, c: &mut Context) -> Result<(), c_int> {
    if p.is_null() {
        Err(c.fail(libc::EINVAL, format!("{what} is NULL")))
    } else {
        Ok(())
    }
}

/// Runs `call` on a context and writes what it returns, converted by `value`, through the
/// caller's out-pointer `out` (`what` names it in the error for NULL, checked first).
fn call_out<T, V, E: Into<Fail>>(
    ctx: *mut Context,
    out: *mut V,
    what: &str,
    call: impl FnOnce(&mut Context) -> Result<T, E>,
    value: impl FnOnce(T) -> V,
) -> c_int {
    // No input to read: `&()` stands for it (never NULL).
    call_in_out(ctx, &(), "", out, what, |c, _| call(c), value)
}

/// [`call_out`] for a call that reads the caller's struct `input` (`in_what` names it in
/// the error for NULL; checked before `out`).
fn call_in_out<I, T, V, E: Into<Fail>>(
    ctx: *mut Context,
    input: *const I,
    in_what: &str,
    out: *mut V,
    what: &str,
    call: impl FnOnce(&mut Context, &I) -> Result<T, E>,
    value: impl FnOnce(T) -> V,
) -> c_int {
    with_ctx(ctx, |c| {
        if let Err(e) = nonnull(input, in_what, c).and_then(|_| nonnull(out, what, c)) {
            return e;
        }
        // SAFETY: checked non-null; the caller's struct.
        let r = call(c, unsafe { &*input });
        // SAFETY: checked non-null; the caller's out-pointer.
        c.done(r, |_, v| unsafe { out.write(value(v)) })
    })
}

/// Runs `call` on a context: 0, or its error as errno and the last-error text.
fn call_unit(
    ctx: *mut Context,
    call: impl FnOnce(&mut Context) -> Result<(), VerbsError>,
) -> c_int {
    with_ctx(ctx, |c| {
        let r = call(c);
        c.done(r, |_, _| {})
    })
}

fn cstr(p: *const c_char) -> Option<String> {
    if p.is_null() {
        return None;
    }
    // SAFETY: the caller passes a NUL-terminated string.
    Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

#[no_mangle]
pub unsafe extern "C" fn ferroce_open(
    socket: *const c_char,
    device: *const c_char,
) -> *mut Context {
    let sock = cstr(socket);
    let dev = cstr(device);
    let r = std::panic::catch_unwind(|| connect(sock.as_deref().map(Path::new), dev.as_deref()));
    let msg = match r {
        Ok(Ok(ctx)) => {
            return Box::into_raw(Box::new(Context {
                ctx,
                last_error: CString::default(),
                buffers: HashMap::new(),
                mrs: HashMap::new(),
                channels: HashMap::new(),
            }))
        }
        Ok(Err(e)) => {
            let errno = match &e {
                ferroce_host::app::remote::ConnectError::Unreachable(_, io) => {
                    io.raw_os_error().unwrap_or(libc::ECONNREFUSED)
                }
                ferroce_host::app::remote::ConnectError::Refused(w) => w.errno(),
                ferroce_host::app::remote::ConnectError::Protocol(_) => libc::EPROTO,
            };
            set_errno(errno);
            e.to_string()
        }
        Err(_) => {
            set_errno(libc::EFAULT);
            "internal error (panic) in libferroce_client".to_string()
        }
    };
    let e = *libc::__errno_location();
    OPEN_ERROR.with(|o| *o.borrow_mut() = CString::new(msg).unwrap_or_default());
    set_errno(e);
    std::ptr::null_mut()
}

#[no_mangle]
pub extern "C" fn ferroce_open_error() -> *const c_char {
    OPEN_ERROR.with(|o| o.borrow().as_ptr())
}

#[no_mangle]
pub unsafe extern "C" fn ferroce_close(ctx: *mut Context) -> c_int {
    if ctx.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: from ferroce_open, not used after this call.
    let mut c = Box::from_raw(ctx);
    c.channels.clear();
    c.ctx.close();
    0
}

#[no_mangle]
pub unsafe extern "C" fn ferroce_last_error(ctx: *mut Context) -> *const c_char {
    if ctx.is_null() {
        return c"no context".as_ptr();
    }
    (*ctx).last_error.as_ptr()
}

#[no_mangle]
pub unsafe extern "C" fn ferroce_query_device(ctx: *mut Context, out: *mut DeviceAttr) -> c_int {
    call_out(
        ctx,
        out,
        "attr",
        |c| c.ctx.query_device(),
        |a| {
            let mut fw = [0 as c_char; 64];
            for (d, s) in fw.iter_mut().zip(roce::engine::FW_VERSION.bytes().take(63)) {
                *d = s as c_char;
            }
            let l = a.limits;
            DeviceAttr {
                fw_ver: fw,
                max_mr_size: a.max_mr_size,
                vendor_id: a.vendor_id,
                vendor_part_id: a.vendor_part_id,
                max_qp: l.max_qp,
                max_qp_wr: l.max_qp_wr,
                max_sge: l.max_sge,
                max_cq: l.max_cq,
                max_cqe: l.max_cqe,
                max_mr: l.max_mr,
                max_pd: l.max_pd,
                max_srq: l.max_srq,
                max_srq_wr: a.max_srq_wr,
                max_srq_sge: a.max_srq_sge,
                max_inline_data: a.max_inline_data,
                max_qp_rd_atom: l.max_qp_rd_atom as u32,
                max_qp_init_rd_atom: a.max_qp_init_rd_atom as u32,
                atomic_cap: a.atomic_cap,
            }
        },
    )
}

#[no_mangle]
pub unsafe extern "C" fn ferroce_query_port(ctx: *mut Context, out: *mut PortAttr) -> c_int {
    call_out(
        ctx,
        out,
        "attr",
        |c| c.ctx.query_port(),
        |p| PortAttr {
            state: if p.active { 4 } else { 1 },
            max_mtu: p.max_mtu as u32,
            active_mtu: p.active_mtu as u32,
            gid_tbl_len: p.gid_tbl_len,
            pkey_tbl_len: p.pkey_tbl_len,
            link_layer: 2,
        },
    )
}

#[no_mangle]
pub unsafe extern "C" fn ferroce_query_gid(ctx: *mut Context, index: u8, gid: *mut u8) -> c_int {
    // The caller's 16-byte array (alignment 1, as u8).
    let out = gid.cast::<[u8; 16]>();
    call_out(ctx, out, "gid", |c| c.ctx.query_gid(index), |g| g.0)
}

#[no_mangle]
pub unsafe extern "C" fn ferroce_alloc_pd(ctx: *mut Context, pd: *mut u32) -> c_int {
    call_out(ctx, pd, "pd", |c| c.ctx.alloc_pd(), |p| p.0)
}

#[no_mangle]
pub unsafe extern "C" fn ferroce_dealloc_pd(ctx: *mut Context, pd: u32) -> c_int {
    call_unit(ctx, |c| c.ctx.dealloc_pd(PdId(pd)))
}

#[no_mangle]
pub unsafe extern "C" fn ferroce_alloc_buf(ctx: *mut Context, len: usize) -> *mut c_void {
    let mut out = std::ptr::null_mut();
    with_ctx(ctx, |c| {
        if len == 0 {
            return c.fail(libc::EINVAL, "zero-length buffer");
        }
        let r = c.ctx.alloc_buffer(len);
        c.done(r, |c, b| {
            out = b.addr() as *mut c_void;
            c.buffers.insert(b.addr(), b);
        })
    });
    out
}

#[no_mangle]
pub unsafe extern "C" fn ferroce_free_buf(ctx: *mut Context, buf: *mut c_void) -> c_int {
    with_ctx(ctx, |c| match c.buffers.remove(&(buf as u64)) {
        Some(_) => 0,
        None => c.fail(libc::EINVAL, "not a buffer of this context"),
    })
}

/// The buffer of `c` holding `[addr, addr + len)`, and the offset in it.
fn buffer_of(c: &Context, addr: u64, len: usize) -> Option<(&Buffer, usize)> {
    c.buffers.values().find_map(|b| {
        let end = addr.checked_add(len as u64)?;
        (addr >= b.addr() && end <= b.addr() + b.len() as u64)
            .then(|| (b, (addr - b.addr()) as usize))
    })
}

#[no_mangle]
pub unsafe extern "C" fn ferroce_reg_mr(
    ctx: *mut Context,
    pd: u32,
    addr: *mut c_void,
    len: usize,
    access: c_int,
    mr: *mut CMr,
) -> c_int {
    with_ctx(ctx, |c| {
        if let Err(e) = nonnull(mr, "mr", c) {
            return e;
        }
        if addr.is_null() || len == 0 {
            return c.fail(libc::EINVAL, "no memory to register (NULL or zero length)");
        }
        let access = Access(access as u32);
        let r = match buffer_of(c, addr as u64, len) {
            Some((b, off)) => {
                let b = b.clone();
                c.ctx.reg_mr(PdId(pd), &b, off, len, access)
            }
            // SAFETY: the caller's memory; the header says no other thread writes it now.
            None => unsafe { c.ctx.reg_mr_addr(PdId(pd), addr as u64, len, access) },
        };
        c.done(r, |c, m| {
            // SAFETY: checked non-null.
            unsafe {
                mr.write(CMr {
                    addr: m.addr,
                    length: m.len,
                    lkey: m.lkey.0,
                    rkey: m.rkey.map_or(0, |k| k.0),
                })
            };
            c.mrs.insert(m.lkey.0, m);
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn ferroce_dereg_mr(ctx: *mut Context, mr: *const CMr) -> c_int {
    with_ctx(ctx, |c| {
        if let Err(e) = nonnull(mr, "mr", c) {
            return e;
        }
        // SAFETY: checked non-null.
        let lkey = unsafe { (*mr).lkey };
        let Some(m) = c.mrs.get(&lkey).cloned() else {
            return c.fail(libc::EINVAL, "not an MR of this context");
        };
        let r = c.ctx.dereg_mr(&m);
        c.done(r, |c, _| {
            c.mrs.remove(&lkey);
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn ferroce_alloc_mw(
    ctx: *mut Context,
    pd: u32,
    ty: c_int,
    rkey: *mut u32,
) -> c_int {
    let ty = match ty {
        1 => Ok(ferroce_host::MwType::One),
        2 => Ok(ferroce_host::MwType::Two),
        t => Err(VerbsError::InvalidArgument(format!(
            "memory window type {t} (1 or 2)"
        ))),
    };
    call_out(
        ctx,
        rkey,
        "rkey",
        |c| c.ctx.alloc_mw(PdId(pd), ty?),
        |k| k.0,
    )
}

#[no_mangle]
pub unsafe extern "C" fn ferroce_dealloc_mw(ctx: *mut Context, rkey: u32) -> c_int {
    call_unit(ctx, |c| c.ctx.dealloc_mw(Rkey(rkey)))
}

#[no_mangle]
pub unsafe extern "C" fn ferroce_create_cq(ctx: *mut Context, cqe: u32, cq: *mut u32) -> c_int {
    call_out(ctx, cq, "cq", |c| c.ctx.create_cq(cqe), |q| q.0)
}

#[no_mangle]
pub unsafe extern "C" fn ferroce_destroy_cq(ctx: *mut Context, cq: u32) -> c_int {
    with_ctx(ctx, |c| {
        c.channels.remove(&cq);
        let r = c.ctx.destroy_cq(CqId(cq));
        c.done(r, |_, _| {})
    })
}

#[no_mangle]
pub unsafe extern "C" fn ferroce_poll_cq(
    ctx: *mut Context,
    cq: u32,
    n: c_int,
    wc: *mut CWc,
) -> c_int {
    let mut count = 0;
    let r = with_ctx(ctx, |c| {
        if n < 0 {
            return c.fail(libc::EINVAL, "negative count");
        }
        if n > 0 {
            if let Err(e) = nonnull(wc, "wc", c) {
                return e;
            }
        }
        // Straight into the caller's array: no intermediate buffer on a poll.
        // `struct ferroce_wc` is the ring's slot: copied as read, after its check.
        let r = c.ctx.poll_cq_slots(CqId(cq), n as usize, |i, slot| {
            // SAFETY: the caller's array of n entries; i < n.
            unsafe { wc.add(i).write(*slot) };
        });
        match r {
            Ok(k) => {
                count = k;
                0
            }
            Err(e) => c.failed(e),
        }
    });
    if r != 0 {
        -r
    } else {
        count as c_int
    }
}

#[no_mangle]
pub unsafe extern "C" fn ferroce_req_notify_cq(
    ctx: *mut Context,
    cq: u32,
    solicited_only: c_int,
) -> c_int {
    with_ctx(ctx, |c| {
        let r = if solicited_only != 0 {
            c.ctx.req_notify_cq_solicited(CqId(cq))
        } else {
            c.ctx.req_notify_cq(CqId(cq))
        };
        c.done(r, |_, _| {})
    })
}

#[no_mangle]
pub unsafe extern "C" fn ferroce_cq_event_fd(ctx: *mut Context, cq: u32) -> c_int {
    let mut fd = -1;
    let r = with_ctx(ctx, |c| {
        if let Some(ch) = c.channels.get(&cq) {
            fd = ch.fd.as_raw_fd();
            return 0;
        }
        let Some(waiter) = c.ctx.cq_notifier(CqId(cq)) else {
            return c.fail(libc::ENOENT, "no such completion queue");
        };
        // SAFETY: eventfd(2); the result is checked and owned.
        let raw = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if raw < 0 {
            let e = std::io::Error::last_os_error();
            return c.fail(e.raw_os_error().unwrap_or(libc::EIO), e.to_string());
        }
        // SAFETY: fresh fd.
        let owned = unsafe { OwnedFd::from_raw_fd(raw) };
        let stop = Arc::new(AtomicBool::new(false));
        let (st, wfd) = (stop.clone(), raw);
        let thread = std::thread::Builder::new()
            .name("ferroce-cq-event".into())
            .spawn(move || {
                // From the last arming, not from now: a notification between arming and
                // this thread's start still counts.
                let mut seen = waiter.armed_at();
                while !st.load(Ordering::Acquire) {
                    if waiter.wait(seen, Duration::from_millis(100)) {
                        seen = waiter.seq();
                        let one = 1u64;
                        // SAFETY: an 8-byte write to our eventfd (open while the channel
                        // lives: the channel joins this thread before closing it).
                        unsafe { libc::write(wfd, &one as *const u64 as *const c_void, 8) };
                    }
                }
            });
        match thread {
            Ok(t) => {
                fd = raw;
                c.channels.insert(
                    cq,
                    EventChannel {
                        fd: owned,
                        stop,
                        thread: Some(t),
                    },
                );
                0
            }
            Err(e) => c.fail(libc::EAGAIN, e.to_string()),
        }
    });
    if r != 0 {
        -1
    } else {
        fd
    }
}

#[no_mangle]
pub unsafe extern "C" fn ferroce_get_cq_event(
    ctx: *mut Context,
    cq: u32,
    timeout_ms: c_int,
) -> c_int {
    with_ctx(ctx, |c| {
        let timeout = (timeout_ms >= 0).then(|| Duration::from_millis(timeout_ms as u64));
        if let Some(ch) = c.channels.get(&cq) {
            // With a channel: one notification is one eventfd count.
            let fd = ch.fd.as_raw_fd();
            let mut p = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one pollfd.
            let n = unsafe { libc::poll(&mut p, 1, timeout_ms) };
            if n == 0 {
                return c.fail(libc::ETIMEDOUT, "no completion event in time");
            }
            if n < 0 {
                let e = std::io::Error::last_os_error();
                return c.fail(e.raw_os_error().unwrap_or(libc::EIO), e.to_string());
            }
            let mut v = 0u64;
            // SAFETY: an 8-byte read from our eventfd.
            unsafe { libc::read(fd, &mut v as *mut u64 as *mut c_void, 8) };
            return 0;
        }
        match c.ctx.wait_cq(CqId(cq), timeout) {
            Ok(true) => 0,
            Ok(false) => c.fail(libc::ETIMEDOUT, "no completion event in time"),
            Err(e) => c.failed(e),
        }
    })
}

fn caps(c: &CQpCap) -> QpCaps {
    QpCaps {
        max_send_wr: c.max_send_wr,
        max_recv_wr: c.max_recv_wr,
        max_send_sge: c.max_send_sge,
        max_recv_sge: c.max_recv_sge,
        max_inline_data: c.max_inline_data,
    }
}

fn c_caps(c: &QpCaps) -> CQpCap {
    CQpCap {
        max_send_wr: c.max_send_wr,
        max_recv_wr: c.max_recv_wr,
        max_send_sge: c.max_send_sge,
        max_recv_sge: c.max_recv_sge,
        max_inline_data: c.max_inline_data,
    }
}

#[no_mangle]
pub unsafe extern "C" fn ferroce_create_srq(
    ctx: *mut Context,
    pd: u32,
    attr: *const CSrqAttr,
    srq: *mut u32,
) -> c_int {
    call_in_out(
        ctx,
        attr,
        "attr",
        srq,
        "srq",
        |c, a| {
            let attr = SrqAttr {
                max_wr: a.max_wr,
                max_sge: a.max_sge,
                srq_limit: a.srq_limit,
            };
            c.ctx.create_srq(PdId(pd), &attr)
        },
        |s| s.0,
    )
}

#[no_mangle]
pub unsafe extern "C" fn ferroce_modify_srq(ctx: *mut Context, srq: u32, limit: u32) -> c_int {
    call_unit(ctx, |c| c.ctx.modify_srq(SrqId(srq), limit))
}

#[no_mangle]
pub unsafe extern "C" fn ferroce_query_srq(
    ctx: *mut Context,
    srq: u32,
    out: *mut CSrqAttr,
) -> c_int {
    call_out(
        ctx,
        out,
        "attr",
        |c| c.ctx.query_srq(SrqId(srq)),
        |a| CSrqAttr {
            max_wr: a.max_wr,
            max_sge: a.max_sge,
            srq_limit: a.srq_limit,
        },
    )
}

#[no_mangle]
pub unsafe extern "C" fn ferroce_destroy_srq(ctx: *mut Context, srq: u32) -> c_int {
    call_unit(ctx, |c| c.ctx.destroy_srq(SrqId(srq)))
}

#[no_mangle]
pub unsafe extern "C" fn ferroce_create_qp(
    ctx: *mut Context,
    init: *const CQpInit,
    qpn: *mut u32,
) -> c_int {
    call_in_out(
        ctx,
        init,
        "init",
        qpn,
        "qpn",
        |c, i| {
            let Some(t) = QpType::from_ibv(i.qp_type) else {
                let why = format!("QP type {} (RC 2, UC 3, UD 4)", i.qp_type);
                return Err(Fail::Refused(libc::EINVAL, why));
            };
            Ok(c.ctx.create_qp(&QpInit {
                pd: PdId(i.pd),
                qp_type: t,
                send_cq: CqId(i.send_cq),
                recv_cq: CqId(i.recv_cq),
                srq: (i.use_srq != 0).then_some(SrqId(i.srq)),
                caps: caps(&i.cap),
                sq_sig_all: i.sq_sig_all != 0,
            })?)
        },
        |q| q.value(),
    )
}

fn av(a: &CAh) -> AddressVector {
    AddressVector {
        dgid: Gid(a.dgid),
        sgid_index: a.sgid_index,
        flow_label: a.flow_label,
        hop_limit: a.hop_limit,
        traffic_class: a.traffic_class,
        sl: a.sl,
        dmac: (a.has_dmac != 0).then_some(a.dmac),
    }
}

#[no_mangle]
pub unsafe extern "C" fn ferroce_modify_qp(
    ctx: *mut Context,
    qpn: u32,
    attr: *const CQpAttr,
    mask: c_int,
) -> c_int {
    with_ctx(ctx, |c| {
        if let Err(e) = nonnull(attr, "attr", c) {
            return e;
        }
        // SAFETY: checked non-null.
        let a = unsafe { &*attr };
        // ferroce.h's address handle is always global (RoCE addresses by GID).
        let fields = roce::ibv_qp_attr_of!(*a, true, av(&a.ah_attr));
        let q = match QpAttr::from_ibv(mask as u32, &fields) {
            Ok(q) => q,
            Err(e) => return c.failed(e),
        };
        let r = c.ctx.modify_qp(Qpn::new(qpn), &q);
        c.done(r, |_, _| {})
    })
}

#[no_mangle]
pub unsafe extern "C" fn ferroce_query_qp(
    ctx: *mut Context,
    qpn: u32,
    attr: *mut CQpAttr,
    init: *mut CQpInit,
) -> c_int {
    with_ctx(ctx, |c| {
        if let Err(e) = nonnull(attr, "attr", c) {
            return e;
        }
        let r = c.ctx.query_qp(Qpn::new(qpn));
        c.done(r, |_, i| {
            let a = &i.attr;
            let ah = a.av.map_or(
                CAh {
                    dgid: [0; 16],
                    flow_label: 0,
                    sgid_index: 0,
                    hop_limit: 0,
                    traffic_class: 0,
                    sl: 0,
                    dmac: [0; 6],
                    has_dmac: 0,
                    reserved: 0,
                },
                |v| CAh {
                    dgid: v.dgid.0,
                    flow_label: v.flow_label,
                    sgid_index: v.sgid_index,
                    hop_limit: v.hop_limit,
                    traffic_class: v.traffic_class,
                    sl: v.sl,
                    dmac: v.dmac.unwrap_or([0; 6]),
                    has_dmac: v.dmac.is_some() as u8,
                    reserved: 0,
                },
            );
            // SAFETY: checked non-null.
            unsafe {
                attr.write(CQpAttr {
                    qp_state: i.state.to_ibv(),
                    cur_qp_state: i.state.to_ibv(),
                    path_mtu: a.path_mtu.map_or(0, |m| m as u32),
                    qp_access_flags: a.access.map_or(0, |x| x.0),
                    qkey: a.qkey.map_or(0, |k| k.0),
                    rq_psn: a.rq_psn.map_or(0, |p| p.value()),
                    sq_psn: a.sq_psn.map_or(0, |p| p.value()),
                    dest_qp_num: a.dest_qp.map_or(0, |q| q.value()),
                    ah_attr: ah,
                    pkey_index: a.pkey_index.unwrap_or(0),
                    port_num: a.port.unwrap_or(1),
                    max_rd_atomic: a.max_rd_atomic.unwrap_or(0),
                    max_dest_rd_atomic: a.max_dest_rd_atomic.unwrap_or(0),
                    min_rnr_timer: a.min_rnr_timer.unwrap_or(0),
                    timeout: a.timeout.unwrap_or(0),
                    retry_cnt: a.retry_cnt.unwrap_or(0),
                    rnr_retry: a.rnr_retry.unwrap_or(0),
                    en_sqd_async_notify: a.en_sqd_async_notify.unwrap_or(false) as u8,
                    reserved: [0; 2],
                    cap: c_caps(&i.caps),
                })
            };
            if !init.is_null() {
                // SAFETY: non-null; the caller's struct. PD and CQs are not kept per QP by
                // query_qp: they read as 0.
                unsafe {
                    init.write(CQpInit {
                        pd: 0,
                        send_cq: 0,
                        recv_cq: 0,
                        srq: 0,
                        use_srq: 0,
                        qp_type: i.qp_type.to_ibv(),
                        cap: c_caps(&i.caps),
                        sq_sig_all: i.sq_sig_all as u32,
                    })
                };
            }
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn ferroce_destroy_qp(ctx: *mut Context, qpn: u32) -> c_int {
    call_unit(ctx, |c| c.ctx.destroy_qp(Qpn::new(qpn)))
}

/// Copies a C SGE list (at most MAX_SGE entries).
fn sges(list: *const CSge, n: u32, out: &mut [Sge; MAX_SGE]) -> Result<usize, String> {
    let n = n as usize;
    if n > MAX_SGE {
        return Err(format!("{n} SGEs (at most {MAX_SGE})"));
    }
    if n > 0 && list.is_null() {
        return Err("sg_list is NULL".into());
    }
    for (i, o) in out.iter_mut().enumerate().take(n) {
        // SAFETY: the caller's array of n entries.
        let s = unsafe { *list.add(i) };
        *o = Sge {
            addr: s.addr,
            length: s.length,
            lkey: Lkey(s.lkey),
        };
    }
    Ok(n)
}

/// The caller's work request `wr` (its SGE list given by `sgl`) with the SGEs copied into
/// `list`, and their count; or the failure, reported.
fn read_wr<'a, W>(
    c: &mut Context,
    wr: *const W,
    sgl: impl FnOnce(&W) -> (*const CSge, u32),
    list: &mut [Sge; MAX_SGE],
) -> Result<(&'a W, usize), c_int> {
    nonnull(wr, "wr", c)?;
    // SAFETY: checked non-null; the caller's WR.
    let w = unsafe { &*wr };
    let (p, n) = sgl(w);
    match sges(p, n, list) {
        Ok(n) => Ok((w, n)),
        Err(m) => Err(c.fail(libc::EINVAL, m)),
    }
}

#[no_mangle]
pub unsafe extern "C" fn ferroce_post_send(
    ctx: *mut Context,
    qpn: u32,
    wr: *const CSendWr,
) -> c_int {
    with_ctx(ctx, |c| {
        let mut list = [Sge::default(); MAX_SGE];
        let (w, n) = match read_wr(c, wr, |w| (w.sg_list, w.num_sge), &mut list) {
            Ok(r) => r,
            Err(e) => return e,
        };
        // ferroce.h's send WR carries the ibv_send_wr fields flat; BIND_MW puts the window's
        // key in rkey, its new key in imm_data, the MR in bind_lkey, the range in
        // remote_addr/compare_add and the access in swap.
        let f = ibv::IbvSendFields {
            remote_addr: w.remote_addr,
            rkey: w.rkey,
            imm: w.imm_data,
            invalidate_rkey: w.imm_data,
            compare_add: w.compare_add,
            swap: w.swap,
            bind: ibv::IbvBind {
                mw: w.rkey,
                rkey: w.imm_data,
                mr: w.bind_lkey,
                addr: w.remote_addr,
                length: w.compare_add,
                access: w.swap as u32,
            },
        };
        let op = match WrOp::from_ibv(w.opcode, &f) {
            Ok(op) => op,
            Err(e) => return c.failed(e),
        };
        let ud = if w.ah.is_null() {
            None
        } else {
            // SAFETY: non-null; the caller's address handle.
            Some(UdDest {
                ah: av(unsafe { &*w.ah }),
                remote_qpn: Qpn::new(w.remote_qpn),
                remote_qkey: Qkey(w.remote_qkey),
            })
        };
        let flags = SendFlags::from_ibv(w.send_flags);
        let inline = flags.contains(SendFlags::INLINE) && !op.is_read_or_atomic();
        let r = if inline {
            // Inline data is copied now from wherever the SGEs point (verbs: no key check).
            let total: usize = list[..n].iter().map(|s| s.length as usize).sum();
            if total > roce::engine::MAX_INLINE {
                return c.fail(
                    libc::EINVAL,
                    format!(
                        "{total} inline bytes (at most {})",
                        roce::engine::MAX_INLINE
                    ),
                );
            }
            let mut data = [0u8; roce::engine::MAX_INLINE];
            let mut k = 0;
            for s in &list[..n] {
                if s.length > 0 && s.addr == 0 {
                    return c.fail(libc::EINVAL, "inline SGE at address 0");
                }
                // SAFETY: the caller's memory, as ibv_post_send with IBV_SEND_INLINE reads it.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        s.addr as *const u8,
                        data.as_mut_ptr().add(k),
                        s.length as usize,
                    )
                };
                k += s.length as usize;
            }
            let bare = SendWr {
                wr_id: w.wr_id,
                op,
                sg_list: &[],
                flags,
                ud,
            };
            c.ctx.post_send_inline(Qpn::new(qpn), &bare, &data[..k])
        } else {
            c.ctx.post_send(
                Qpn::new(qpn),
                &SendWr {
                    wr_id: w.wr_id,
                    op,
                    sg_list: &list[..n],
                    flags,
                    ud,
                },
            )
        };
        c.done(r, |_, _| {})
    })
}

fn recv(
    c: &mut Context,
    wr: *const CRecvWr,
    post: impl FnOnce(&mut Context, &RecvWr<'_>) -> Result<(), VerbsError>,
) -> c_int {
    let mut list = [Sge::default(); MAX_SGE];
    let (w, n) = match read_wr(c, wr, |w| (w.sg_list, w.num_sge), &mut list) {
        Ok(r) => r,
        Err(e) => return e,
    };
    let r = post(
        c,
        &RecvWr {
            wr_id: w.wr_id,
            sg_list: &list[..n],
        },
    );
    c.done(r, |_, _| {})
}

#[no_mangle]
pub unsafe extern "C" fn ferroce_post_recv(
    ctx: *mut Context,
    qpn: u32,
    wr: *const CRecvWr,
) -> c_int {
    with_ctx(ctx, |c| {
        recv(c, wr, |c, r| c.ctx.post_recv(Qpn::new(qpn), r))
    })
}

#[no_mangle]
pub unsafe extern "C" fn ferroce_post_srq_recv(
    ctx: *mut Context,
    srq: u32,
    wr: *const CRecvWr,
) -> c_int {
    with_ctx(ctx, |c| {
        recv(c, wr, |c, r| c.ctx.post_srq_recv(SrqId(srq), r))
    })
}

#[no_mangle]
pub unsafe extern "C" fn ferroce_get_async_event(ctx: *mut Context, ev: *mut CEvent) -> c_int {
    with_ctx(ctx, |c| {
        if let Err(e) = nonnull(ev, "ev", c) {
            return e;
        }
        match c.ctx.poll_event() {
            Some(e) => {
                // SAFETY: checked non-null.
                unsafe { ev.write(EventSlot::encode(&e)) };
                0
            }
            None => {
                set_errno(libc::EAGAIN);
                libc::EAGAIN
            }
        }
    })
}
