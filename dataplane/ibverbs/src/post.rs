//! Posting: `ibv_post_send`, `ibv_post_recv`, `ibv_post_srq_recv` (`context->ops`), from the
//! application's WR lists to the client.

use super::*;

pub(crate) const MAX_SGE: usize = ferroce_host::abi::slots::MAX_HOST_SGE;

pub(crate) unsafe fn sges(
    list: *const sys::ibv_sge,
    n: c_int,
    out: &mut [Sge; MAX_SGE],
) -> Option<usize> {
    let n = usize::try_from(n).ok()?;
    if n > MAX_SGE || (n > 0 && list.is_null()) {
        return None;
    }
    for (i, o) in out.iter_mut().enumerate().take(n) {
        let s = *list.add(i);
        *o = Sge {
            addr: s.addr,
            length: s.length,
            lkey: Lkey(s.lkey),
        };
    }
    Some(n)
}

/// Posts one `ibv_send_wr`. `wr.ud` shares a union with `wr.rdma` and `wr.atomic`, so it
/// is read only on a UD QP.
pub(crate) unsafe fn one_send(
    cl: &mut RemoteContext,
    qpn: Qpn,
    ud_qp: bool,
    w: &sys::ibv_send_wr,
) -> c_int {
    let mut list = [Sge::default(); MAX_SGE];
    let Some(n) = sges(w.sg_list, w.num_sge, &mut list) else {
        return libc::EINVAL;
    };
    let op = if w.opcode == ibv::wr_opcode::BIND_MW {
        let b = w.__bindgen_anon_2.bind_mw;
        match bind_op(b.mw, b.rkey, &b.bind_info) {
            Some(op) => op,
            None => return libc::EINVAL,
        }
    } else {
        // The union members by opcode: wr.rdma for WRITE/READ, wr.atomic for ATOMICs (the
        // same leading fields), imm_data (network order) or invalidate_rkey.
        let (rdma, atomic) = (w.wr.rdma, w.wr.atomic);
        let atomic_op = matches!(
            w.opcode,
            ibv::wr_opcode::ATOMIC_CMP_AND_SWP | ibv::wr_opcode::ATOMIC_FETCH_AND_ADD
        );
        let f = ibv::IbvSendFields {
            remote_addr: if atomic_op {
                atomic.remote_addr
            } else {
                rdma.remote_addr
            },
            rkey: if atomic_op { atomic.rkey } else { rdma.rkey },
            imm: u32::from_be(w.__bindgen_anon_1.imm_data),
            invalidate_rkey: w.__bindgen_anon_1.invalidate_rkey,
            compare_add: atomic.compare_add,
            swap: atomic.swap,
            bind: ibv::IbvBind::default(),
        };
        match WrOp::from_ibv(w.opcode, &f) {
            Ok(op) => op,
            Err(e) => {
                return if e.is_unsupported() {
                    explain(&VerbsError::InvalidArgument(e.to_string()));
                    libc::EOPNOTSUPP
                } else {
                    invalid(&format!("ibv_post_send: {e}"))
                }
            }
        }
    };
    let ud = if !ud_qp || w.wr.ud.ah.is_null() {
        None
    } else {
        let u = w.wr.ud;
        Some(UdDest {
            ah: (*(u.ah as *mut Ah)).av,
            remote_qpn: Qpn::new(u.remote_qpn),
            remote_qkey: Qkey(u.remote_qkey),
        })
    };
    let flags = SendFlags::from_ibv(w.send_flags);
    submit(cl, qpn, w.wr_id, op, &list[..n], flags, ud, None)
}

/// Posts one send WR: `inline` carries bytes already copied (`ibv_wr_set_inline_data`);
/// otherwise with `IBV_SEND_INLINE` the SGEs' bytes are copied now from wherever they point
/// (inline data needs no key); otherwise the SGEs go to the engine.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn submit(
    cl: &mut RemoteContext,
    qpn: Qpn,
    wr_id: u64,
    op: WrOp,
    list: &[Sge],
    flags: SendFlags,
    ud: Option<UdDest>,
    inline: Option<&[u8]>,
) -> c_int {
    let bare = SendWr {
        wr_id,
        op,
        sg_list: &[],
        flags: SendFlags(flags.0 | SendFlags::INLINE.0),
        ud,
    };
    let r = if let Some(data) = inline {
        cl.post_send_inline(qpn, &bare, data)
    } else if flags.contains(SendFlags::INLINE) && !op.is_read_or_atomic() {
        let total: usize = list.iter().map(|s| s.length as usize).sum();
        if total > roce::engine::MAX_INLINE {
            return libc::EINVAL;
        }
        let mut data = [0u8; roce::engine::MAX_INLINE];
        let mut k = 0;
        for s in list {
            if s.length > 0 {
                if s.addr == 0 {
                    return libc::EINVAL;
                }
                std::ptr::copy_nonoverlapping(
                    s.addr as *const u8,
                    data.as_mut_ptr().add(k),
                    s.length as usize,
                );
                k += s.length as usize;
            }
        }
        cl.post_send_inline(qpn, &bare, &data[..k])
    } else {
        cl.post_send(
            qpn,
            &SendWr {
                wr_id,
                op,
                sg_list: list,
                flags,
                ud,
            },
        )
    };
    status(r, |()| ())
}

pub(crate) unsafe extern "C" fn post_send(
    qp: *mut sys::ibv_qp,
    wr: *mut sys::ibv_send_wr,
    bad: *mut *mut sys::ibv_send_wr,
) -> c_int {
    with_obj(qp, |ctx, q: *mut Qp| {
        let (qpn, ud_qp) = ((*q).qpn, (*qp).qp_type == sys::IBV_QPT_UD);
        // A chain of WRs rings the worker's doorbell once (published together at the end).
        client(ctx).batch(|cl| chain(wr, bad, |w| (*w).next, |w| one_send(cl, qpn, ud_qp, w)))
    })
}

/// Posts the WRs of a chain from `wr` (`next` leads on) one by one: at the first that
/// fails, `*bad` names it and its errno is returned.
pub(crate) unsafe fn chain<W>(
    wr: *mut W,
    bad: *mut *mut W,
    next: impl Fn(*mut W) -> *mut W,
    mut post: impl FnMut(&W) -> c_int,
) -> c_int {
    let mut w = wr;
    while !w.is_null() {
        let e = post(&*w);
        if e != 0 {
            if !bad.is_null() {
                *bad = w;
            }
            return e;
        }
        w = next(w);
    }
    0
}

/// Posts a chain of receive WRs to the queue of `obj`, a QP or an SRQ heading a `T`: `post`
/// posts one.
pub(crate) unsafe fn post_recvs<I: InContext, T>(
    obj: *mut I,
    wr: *mut sys::ibv_recv_wr,
    bad: *mut *mut sys::ibv_recv_wr,
    post: impl Fn(&mut RemoteContext, &T, &RecvWr<'_>) -> VerbsResult<()>,
) -> c_int {
    with_obj(obj, |ctx, o: *mut T| {
        let o = &*o;
        client(ctx).batch(|cl| chain(wr, bad, |w| (*w).next, |w| one_recv(w, |r| post(cl, o, r))))
    })
}

/// Posts one `ibv_recv_wr` with `post`.
pub(crate) unsafe fn one_recv(
    w: &sys::ibv_recv_wr,
    post: impl FnOnce(&RecvWr<'_>) -> VerbsResult<()>,
) -> c_int {
    let mut list = [Sge::default(); MAX_SGE];
    let Some(n) = sges(w.sg_list, w.num_sge, &mut list) else {
        return libc::EINVAL;
    };
    let r = RecvWr {
        wr_id: w.wr_id,
        sg_list: &list[..n],
    };
    status(post(&r), |()| ())
}

pub(crate) unsafe extern "C" fn post_recv(
    qp: *mut sys::ibv_qp,
    wr: *mut sys::ibv_recv_wr,
    bad: *mut *mut sys::ibv_recv_wr,
) -> c_int {
    post_recvs(qp, wr, bad, |cl, q: &Qp, r| cl.post_recv(q.qpn, r))
}

pub(crate) unsafe extern "C" fn post_srq_recv(
    srq: *mut sys::ibv_srq,
    wr: *mut sys::ibv_recv_wr,
    bad: *mut *mut sys::ibv_recv_wr,
) -> c_int {
    post_recvs(srq, wr, bad, |cl, s: &Srq, r| cl.post_srq_recv(s.id, r))
}
