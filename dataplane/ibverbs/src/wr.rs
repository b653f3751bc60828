//! The `ibv_wr_*` posting API (IBVERBS_1.6): work requests are built between `wr_start` and
//! `wr_complete` and posted together; an error while building fails the whole batch at
//! `wr_complete`, which posts nothing unless every WR is valid and the send queue has room for
//! all of them.

use super::*;

/// One WR being built.
#[derive(Clone, Copy)]
pub(crate) struct Building {
    pub(crate) wr_id: u64,
    pub(crate) flags: SendFlags,
    pub(crate) op: WrOp,
    pub(crate) sges: [Sge; MAX_SGE],
    pub(crate) nsge: usize,
    pub(crate) ud: Option<UdDest>,
    pub(crate) inline_len: Option<usize>,
    pub(crate) inline: [u8; roce::engine::MAX_INLINE],
}

/// The WRs between `ibv_wr_start` and `ibv_wr_complete`/`ibv_wr_abort`.
#[derive(Default)]
pub(crate) struct Batch {
    pub(crate) open: bool,
    /// The first error met while building (reported by `wr_complete`).
    pub(crate) err: c_int,
    pub(crate) wrs: Vec<Building>,
}

/// The batch of a QP. Between `wr_start` and `wr_complete`/`wr_abort` it belongs to the
/// thread that started it (`Qp::batch_owner`); the setters in between are that thread's.
pub(crate) unsafe fn batch<'a>(qp: *mut sys::ibv_qp_ex) -> &'a mut Batch {
    &mut *(*(qp as *mut Qp)).batch.get()
}

pub(crate) unsafe fn fail(qp: *mut sys::ibv_qp_ex, e: c_int) {
    if !owns_batch(qp) {
        return;
    }
    let b = batch(qp);
    if b.err == 0 {
        b.err = e;
    }
}

/// Starts a WR: the operation, with the `wr_id` and `wr_flags` the application set in the
/// `ibv_qp_ex` (verbs.h: they are read when the operation is called).
pub(crate) unsafe fn begin(qp: *mut sys::ibv_qp_ex, need: u32, op: WrOp) {
    // The batch is on the heap: not while registration moves pages (MOVING).
    let _moving = moving_read();
    if !owns_batch(qp) {
        // Not between this thread's wr_start and wr_complete: nothing to add to (and
        // another thread's batch is not touched).
        return;
    }
    let q = &*(qp as *mut Qp);
    let b = batch(qp);
    if !b.open {
        fail(qp, libc::EINVAL);
        return;
    }
    if q.send_ops & need as u64 == 0 {
        // An operation not declared in send_ops_flags.
        fail(qp, libc::EOPNOTSUPP);
        return;
    }
    if b.wrs.len() >= q.max_send_wr as usize {
        // More than the send queue could ever hold: ENOMEM, as a full queue.
        fail(qp, libc::ENOMEM);
        return;
    }
    b.wrs.push(Building {
        wr_id: (*qp).wr_id,
        flags: SendFlags((*qp).wr_flags & 0xf),
        op,
        sges: [Sge::default(); MAX_SGE],
        nsge: 0,
        ud: None,
        inline_len: None,
        inline: [0; roce::engine::MAX_INLINE],
    });
}

/// The WR a setter applies to (the last one started), or a batch error.
pub(crate) unsafe fn current<'a>(qp: *mut sys::ibv_qp_ex) -> Option<&'a mut Building> {
    if !owns_batch(qp) {
        return None;
    }
    let b = batch(qp);
    let w = b.wrs.last_mut();
    if w.is_none() {
        fail(qp, libc::EINVAL);
    }
    w
}

/// A nonzero number for the calling thread.
pub(crate) fn thread_token() -> u64 {
    thread_local!(static TOKEN: u8 = const { 0 });
    TOKEN.with(|t| t as *const u8 as u64)
}

/// Whether the calling thread has the QP's batch open.
pub(crate) unsafe fn owns_batch(qp: *mut sys::ibv_qp_ex) -> bool {
    (*(qp as *mut Qp)).batch_owner.load(Ordering::Acquire) == thread_token()
}

/// Ends the calling thread's batch, letting another thread start one.
pub(crate) unsafe fn release_batch(qp: *mut sys::ibv_qp_ex) {
    let me = thread_token();
    let _ = (*(qp as *mut Qp)).batch_owner.compare_exchange(
        me,
        0,
        Ordering::Release,
        Ordering::Relaxed,
    );
}

pub(crate) unsafe extern "C" fn wr_start(qp: *mut sys::ibv_qp_ex) {
    if qp.is_null() {
        return;
    }
    // Wait for another thread's batch on this QP to end (ibv_wr_post(3), CONCURRENCY); a
    // second wr_start by the owner restarts its batch.
    // The QP and its batch are on the heap: written only under MOVING (not while
    // registration moves pages), which is let go between attempts, never held while waiting
    // (the batch's owner needs it to finish, and a waiting writer holds back new readers).
    let me = thread_token();
    let owner = &(*(qp as *mut Qp)).batch_owner;
    let _moving = loop {
        let m = moving_read();
        match owner.compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed) {
            Ok(_) => break m,
            Err(cur) if cur == me => break m,
            Err(_) => {
                drop(m);
                std::thread::yield_now();
            }
        }
    };
    let b = batch(qp);
    b.open = true;
    b.err = 0;
    b.wrs.clear();
}

pub(crate) unsafe extern "C" fn wr_abort(qp: *mut sys::ibv_qp_ex) {
    // The batch is on the heap: not while registration moves pages (MOVING).
    let _moving = moving_read();
    if qp.is_null() || !owns_batch(qp) {
        return;
    }
    let b = batch(qp);
    b.open = false;
    b.err = 0;
    b.wrs.clear();
    release_batch(qp);
}

pub(crate) unsafe extern "C" fn wr_complete(qp: *mut sys::ibv_qp_ex) -> c_int {
    // The batch is on the heap: not while registration moves pages (MOVING).
    let _moving = moving_read();
    if qp.is_null() || !owns_batch(qp) {
        // No batch of this thread's is open.
        return libc::EINVAL;
    }
    let r = complete_batch(qp);
    release_batch(qp);
    r
}

/// Posts the open batch whole, or nothing if it is invalid or does not fit.
pub(crate) unsafe fn complete_batch(qp: *mut sys::ibv_qp_ex) -> c_int {
    let q = &*(qp as *mut Qp);
    let b = batch(qp);
    if !b.open {
        return libc::EINVAL;
    }
    b.open = false;
    let err = std::mem::take(&mut b.err);
    if err != 0 {
        b.wrs.clear();
        return err;
    }
    let Some(ctx) = ctx_of(q.ex.qp_base.context) else {
        b.wrs.clear();
        return libc::EINVAL;
    };
    let ud_qp = q.ex.qp_base.qp_type == sys::IBV_QPT_UD;
    if b.wrs.iter().any(|w| ud_qp && w.ud.is_none()) {
        b.wrs.clear();
        return libc::EINVAL;
    }
    let mut cl = client(ctx);
    let room = match cl.sq_room(q.qpn) {
        Ok(r) => r as usize,
        Err(e) => {
            b.wrs.clear();
            return errno_of(&e);
        }
    };
    if b.wrs.len() > room {
        b.wrs.clear();
        return libc::ENOMEM;
    }
    // Every WR passes `post_send`'s checks (SGE count, opcode for the QP type, UD payload
    // against the MTU, atomic buffer, inline size) before any is posted: ibv_wr_complete
    // posts the whole batch or none of it (ibv_wr_post(3)).
    for w in b.wrs.iter() {
        let wr = SendWr {
            wr_id: w.wr_id,
            op: w.op,
            sg_list: &w.sges[..w.nsge],
            // Inline data goes as `submit` posts it: flagged INLINE.
            flags: match w.inline_len {
                Some(_) => SendFlags(w.flags.0 | SendFlags::INLINE.0),
                None => w.flags,
            },
            ud: w.ud,
        };
        if let Err(e) = cl.check_send(q.qpn, &wr, w.inline_len) {
            b.wrs.clear();
            return errno_of(&e);
        }
    }
    // ibv_wr_complete rings the doorbell once for the whole batch.
    let r = cl.batch(|cl| {
        for w in b.wrs.iter() {
            let inline = w.inline_len.map(|n| &w.inline[..n]);
            let r = submit(
                cl,
                q.qpn,
                w.wr_id,
                w.op,
                &w.sges[..w.nsge],
                w.flags,
                w.ud,
                inline,
            );
            if r != 0 {
                // A failure the checks above could not see (the QP left RTS meanwhile):
                // the WRs before it are posted, as with ibv_post_send's bad_wr.
                return r;
            }
        }
        0
    });
    b.wrs.clear();
    r
}

/// Defines the `ibv_wr_*` operations that start a WR: each builds its [`WrOp`] from its
/// arguments and [`begin`]s it, needing its `IBV_QP_EX_WITH_*` bit in `send_ops_flags`;
/// and `WR_OPS`, those bits together.
macro_rules! wr_ops {
    ($($name:ident($($arg:ident: $ty:ty),*) => $need:ident, $op:expr;)*) => {
        $(
            pub(crate) unsafe extern "C" fn $name(qp: *mut sys::ibv_qp_ex, $($arg: $ty),*) {
                begin(qp, sys::$need, $op);
            }
        )*

        /// The `send_ops_flags` bits of the operations that start a WR.
        pub(crate) const WR_OPS: u64 = $(sys::$need as u64)|*;
    };
}

// Immediate data comes in network order (verbs.h); WrOp holds it in host order.
wr_ops! {
    wr_rdma_write(rkey: u32, addr: u64) => IBV_QP_EX_WITH_RDMA_WRITE,
        WrOp::Write { remote_addr: addr, rkey: Rkey(rkey) };
    wr_rdma_write_imm(rkey: u32, addr: u64, imm: u32) => IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM,
        WrOp::WriteWithImm { remote_addr: addr, rkey: Rkey(rkey), imm: u32::from_be(imm) };
    wr_send() => IBV_QP_EX_WITH_SEND, WrOp::Send;
    wr_send_imm(imm: u32) => IBV_QP_EX_WITH_SEND_WITH_IMM,
        WrOp::SendWithImm { imm: u32::from_be(imm) };
    wr_send_inv(rkey: u32) => IBV_QP_EX_WITH_SEND_WITH_INV,
        WrOp::SendWithInv { rkey: Rkey(rkey) };
    wr_rdma_read(rkey: u32, addr: u64) => IBV_QP_EX_WITH_RDMA_READ,
        WrOp::Read { remote_addr: addr, rkey: Rkey(rkey) };
    wr_atomic_cmp_swp(rkey: u32, addr: u64, compare: u64, swap: u64)
        => IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP,
        WrOp::CompareSwap { remote_addr: addr, rkey: Rkey(rkey), compare, swap };
    wr_atomic_fetch_add(rkey: u32, addr: u64, add: u64) => IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD,
        WrOp::FetchAdd { remote_addr: addr, rkey: Rkey(rkey), add };
    wr_local_inv(rkey: u32) => IBV_QP_EX_WITH_LOCAL_INV, WrOp::LocalInv { rkey: Rkey(rkey) };
}

pub(crate) unsafe extern "C" fn wr_set_sge(
    qp: *mut sys::ibv_qp_ex,
    lkey: u32,
    addr: u64,
    length: u32,
) {
    // The batch is on the heap: not while registration moves pages (MOVING).
    let _moving = moving_read();
    if let Some(w) = current(qp) {
        w.sges[0] = Sge {
            addr,
            length,
            lkey: Lkey(lkey),
        };
        w.nsge = 1;
        w.inline_len = None;
    }
}

pub(crate) unsafe extern "C" fn wr_set_sge_list(
    qp: *mut sys::ibv_qp_ex,
    n: usize,
    list: *const sys::ibv_sge,
) {
    // The batch is on the heap: not while registration moves pages (MOVING).
    let _moving = moving_read();
    if let Some(w) = current(qp) {
        let mut out = [Sge::default(); MAX_SGE];
        match c_int::try_from(n)
            .ok()
            .and_then(|n| sges(list, n, &mut out))
        {
            Some(k) => {
                w.sges = out;
                w.nsge = k;
                w.inline_len = None;
            }
            None => fail(qp, libc::EINVAL),
        }
    }
}

/// Copies inline bytes into the current WR (now: the buffers may be reused after the call).
pub(crate) unsafe fn set_inline(qp: *mut sys::ibv_qp_ex, bufs: &[(*const u8, usize)]) {
    let Some(w) = current(qp) else {
        return;
    };
    let total = bufs.iter().fold(0usize, |t, b| t.saturating_add(b.1));
    if total > roce::engine::MAX_INLINE || w.op.is_read_or_atomic() {
        fail(qp, libc::EINVAL);
        return;
    }
    let mut k = 0;
    for &(p, n) in bufs {
        if n > 0 {
            if p.is_null() {
                fail(qp, libc::EINVAL);
                return;
            }
            std::ptr::copy_nonoverlapping(p, w.inline.as_mut_ptr().add(k), n);
            k += n;
        }
    }
    w.nsge = 0;
    w.inline_len = Some(k);
}

pub(crate) unsafe extern "C" fn wr_set_inline_data(
    qp: *mut sys::ibv_qp_ex,
    addr: *mut c_void,
    len: usize,
) {
    // The batch is on the heap: not while registration moves pages (MOVING).
    let _moving = moving_read();
    set_inline(qp, &[(addr as *const u8, len)]);
}

pub(crate) unsafe extern "C" fn wr_set_inline_data_list(
    qp: *mut sys::ibv_qp_ex,
    n: usize,
    list: *const sys::ibv_data_buf,
) {
    // The batch is on the heap: not while registration moves pages (MOVING).
    let _moving = moving_read();
    if n > MAX_SGE || (n > 0 && list.is_null()) {
        fail(qp, libc::EINVAL);
        return;
    }
    let mut bufs = [(std::ptr::null::<u8>(), 0usize); MAX_SGE];
    for (i, b) in bufs.iter_mut().enumerate().take(n) {
        let d = *list.add(i);
        *b = (d.addr as *const u8, d.length);
    }
    set_inline(qp, &bufs[..n]);
}

pub(crate) unsafe extern "C" fn wr_set_ud_addr(
    qp: *mut sys::ibv_qp_ex,
    ah: *mut sys::ibv_ah,
    remote_qpn: u32,
    remote_qkey: u32,
) {
    if ah.is_null() {
        fail_now(qp, libc::EINVAL);
        return;
    }
    // The batch is on the heap: not while registration moves pages (MOVING).
    let _moving = moving_read();
    if let Some(w) = current(qp) {
        w.ud = Some(UdDest {
            ah: (*(ah as *mut Ah)).av,
            remote_qpn: Qpn::new(remote_qpn),
            remote_qkey: Qkey(remote_qkey),
        });
    }
}

/// `ibv_wr_bind_mw`: binds a type 2 window (`rkey` is its new key) in the batch.
pub(crate) unsafe extern "C" fn wr_bind_mw(
    qp: *mut sys::ibv_qp_ex,
    mw: *mut sys::ibv_mw,
    rkey: u32,
    info: *const sys::ibv_mw_bind_info,
) {
    match bind_op(mw, rkey, info) {
        Some(op) => begin(qp, sys::IBV_QP_EX_WITH_BIND_MW, op),
        None => fail_now(qp, libc::EINVAL),
    }
}

/// Fails the batch with `e` (a setter's argument error, or an operation ferroce lacks).
unsafe fn fail_now(qp: *mut sys::ibv_qp_ex, e: c_int) {
    // The batch is on the heap: not while registration moves pages (MOVING).
    let _moving = moving_read();
    fail(qp, e);
}

pub(crate) unsafe extern "C" fn wr_send_tso(
    qp: *mut sys::ibv_qp_ex,
    _hdr: *mut c_void,
    _sz: u16,
    _mss: u16,
) {
    fail_now(qp, libc::EOPNOTSUPP);
}

pub(crate) unsafe extern "C" fn wr_set_xrc_srqn(qp: *mut sys::ibv_qp_ex, _srqn: u32) {
    fail_now(qp, libc::EOPNOTSUPP);
}

pub(crate) unsafe extern "C" fn wr_atomic_write(
    qp: *mut sys::ibv_qp_ex,
    _rkey: u32,
    _addr: u64,
    _wr: *const c_void,
) {
    fail_now(qp, libc::EOPNOTSUPP);
}
