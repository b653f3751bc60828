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
    let rdma = w.wr.rdma;
    let atomic = w.wr.atomic;
    let op = match w.opcode {
        sys::IBV_WR_RDMA_WRITE => WrOp::Write {
            remote_addr: rdma.remote_addr,
            rkey: Rkey(rdma.rkey),
        },
        sys::IBV_WR_RDMA_WRITE_WITH_IMM => WrOp::WriteWithImm {
            remote_addr: rdma.remote_addr,
            rkey: Rkey(rdma.rkey),
            imm: u32::from_be(w.__bindgen_anon_1.imm_data),
        },
        sys::IBV_WR_SEND => WrOp::Send,
        sys::IBV_WR_SEND_WITH_IMM => WrOp::SendWithImm {
            imm: u32::from_be(w.__bindgen_anon_1.imm_data),
        },
        sys::IBV_WR_RDMA_READ => WrOp::Read {
            remote_addr: rdma.remote_addr,
            rkey: Rkey(rdma.rkey),
        },
        sys::IBV_WR_ATOMIC_CMP_AND_SWP => WrOp::CompareSwap {
            remote_addr: atomic.remote_addr,
            rkey: Rkey(atomic.rkey),
            compare: atomic.compare_add,
            swap: atomic.swap,
        },
        sys::IBV_WR_ATOMIC_FETCH_AND_ADD => WrOp::FetchAdd {
            remote_addr: atomic.remote_addr,
            rkey: Rkey(atomic.rkey),
            add: atomic.compare_add,
        },
        sys::IBV_WR_LOCAL_INV => WrOp::LocalInv {
            rkey: Rkey(w.__bindgen_anon_1.invalidate_rkey),
        },
        sys::IBV_WR_SEND_WITH_INV => WrOp::SendWithInv {
            rkey: Rkey(w.__bindgen_anon_1.invalidate_rkey),
        },
        sys::IBV_WR_BIND_MW => {
            let b = w.__bindgen_anon_2.bind_mw;
            match bind_op(b.mw, b.rkey, &b.bind_info) {
                Some(op) => op,
                None => return libc::EINVAL,
            }
        }
        _ => return libc::EINVAL,
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
    let flags = SendFlags(w.send_flags & 0xf);
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
    match r {
        Ok(()) => 0,
        Err(e) => errno_of(&e),
    }
}

pub(crate) unsafe extern "C" fn post_send(
    qp: *mut sys::ibv_qp,
    wr: *mut sys::ibv_send_wr,
    bad: *mut *mut sys::ibv_send_wr,
) -> c_int {
    if qp.is_null() {
        return libc::EINVAL;
    }
    let Some(ctx) = ctx_of((*qp).context) else {
        return libc::EINVAL;
    };
    let qpn = (*(qp as *mut Qp)).qpn;
    let ud_qp = (*qp).qp_type == sys::IBV_QPT_UD;
    let mut cl = client(ctx);
    let mut w = wr;
    while !w.is_null() {
        let e = one_send(&mut cl, qpn, ud_qp, &*w);
        if e != 0 {
            if !bad.is_null() {
                *bad = w;
            }
            return e;
        }
        w = (*w).next;
    }
    0
}

pub(crate) unsafe fn recv_chain(
    wr: *mut sys::ibv_recv_wr,
    bad: *mut *mut sys::ibv_recv_wr,
    mut post: impl FnMut(&RecvWr<'_>) -> Result<(), VerbsError>,
) -> c_int {
    let mut w = wr;
    while !w.is_null() {
        let mut list = [Sge::default(); MAX_SGE];
        let r = match sges((*w).sg_list, (*w).num_sge, &mut list) {
            None => libc::EINVAL,
            Some(n) => match post(&RecvWr {
                wr_id: (*w).wr_id,
                sg_list: &list[..n],
            }) {
                Ok(()) => 0,
                Err(e) => errno_of(&e),
            },
        };
        if r != 0 {
            if !bad.is_null() {
                *bad = w;
            }
            return r;
        }
        w = (*w).next;
    }
    0
}

pub(crate) unsafe extern "C" fn post_recv(
    qp: *mut sys::ibv_qp,
    wr: *mut sys::ibv_recv_wr,
    bad: *mut *mut sys::ibv_recv_wr,
) -> c_int {
    if qp.is_null() {
        return libc::EINVAL;
    }
    let Some(ctx) = ctx_of((*qp).context) else {
        return libc::EINVAL;
    };
    let qpn = (*(qp as *mut Qp)).qpn;
    let mut cl = client(ctx);
    recv_chain(wr, bad, |r| cl.post_recv(qpn, r))
}

pub(crate) unsafe extern "C" fn post_srq_recv(
    srq: *mut sys::ibv_srq,
    wr: *mut sys::ibv_recv_wr,
    bad: *mut *mut sys::ibv_recv_wr,
) -> c_int {
    if srq.is_null() {
        return libc::EINVAL;
    }
    let Some(ctx) = ctx_of((*srq).context) else {
        return libc::EINVAL;
    };
    let id = (*(srq as *mut Srq)).id;
    let mut cl = client(ctx);
    recv_chain(wr, bad, |r| cl.post_srq_recv(id, r))
}
