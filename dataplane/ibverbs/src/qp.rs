//! QPs: create (also `_ex`), modify, query, destroy.

use super::*;

/// A QP: the application's `ibv_qp_ex` first (its head is the `ibv_qp`), then the work
/// requests the `ibv_wr_*` API is building.
#[repr(C)]
pub(crate) struct Qp {
    pub(crate) ex: sys::ibv_qp_ex,
    pub(crate) qpn: Qpn,
    /// Created by `ibv_create_qp_ex` with send_ops_flags: `ibv_qp_to_qp_ex` answers.
    pub(crate) wr_api: bool,
    /// The operations the application said it would build (`send_ops_flags`).
    pub(crate) send_ops: u64,
    /// The send queue's depth (bounds a batch).
    pub(crate) max_send_wr: u32,
    pub(crate) batch: std::cell::UnsafeCell<Batch>,
    /// The thread whose batch is open (0: none): `ibv_wr_post(3)` makes `wr_start` ...
    /// `wr_complete`/`wr_abort` a per-QP critical section that the provider keeps.
    pub(crate) batch_owner: AtomicU64,
    /// Its asynchronous events not yet acknowledged hold its memory.
    pub(crate) async_events: Acks,
}

listed!(Qp, sys::ibv_qp, qps, |q| q.qpn.value(), |c, q| c.destroy_qp(q.qpn););

#[no_mangle]
pub unsafe extern "C" fn ibv_create_qp(
    pd: *mut sys::ibv_pd,
    init: *mut sys::ibv_qp_init_attr,
) -> *mut sys::ibv_qp {
    guard(std::ptr::null_mut(), || {
        let Some(ctx) = owner_ctx(pd).filter(|_| !init.is_null()) else {
            return null_errno(libc::EINVAL);
        };
        let i = &mut *init;
        let Some(t) = QpType::from_ibv(i.qp_type) else {
            return null_errno(libc::EOPNOTSUPP);
        };
        if i.send_cq.is_null() || i.recv_cq.is_null() {
            return null_errno(libc::EINVAL);
        }
        // The CQs and the SRQ must be this context's own objects (as the kernel resolves
        // handles per ucontext): a CQ of another context - another device, or another
        // ibv_open_device of this one - would otherwise be taken by its number, which names
        // some other CQ here.
        {
            let o = objects(ctx);
            let ours = |t: &HashMap<u32, usize>, h: u32, p: usize| t.get(&h) == Some(&p);
            let cqs_ok = [i.send_cq, i.recv_cq]
                .iter()
                .all(|&c| (*c).context == (*pd).context && ours(&o.cqs, (*c).handle, c as usize));
            let srq_ok = i.srq.is_null()
                || ((*i.srq).context == (*pd).context
                    && ours(&o.srqs, (*i.srq).handle, i.srq as usize));
            if !cqs_ok || !srq_ok {
                drop(o);
                explain(&VerbsError::InvalidArgument(format!(
                    "ibv_create_qp: the {} belongs to another context",
                    if cqs_ok { "SRQ" } else { "CQ" }
                )));
                return null_errno(libc::EINVAL);
            }
        }
        let caps = QpCaps {
            max_send_wr: i.cap.max_send_wr.max(1),
            max_recv_wr: if i.srq.is_null() {
                i.cap.max_recv_wr.max(1)
            } else {
                1
            },
            max_send_sge: i.cap.max_send_sge.max(1),
            max_recv_sge: i.cap.max_recv_sge.max(1),
            max_inline_data: i.cap.max_inline_data,
        };
        let qi = QpInit {
            pd: (*(pd as *mut Pd)).id,
            qp_type: t,
            send_cq: CqId((*i.send_cq).handle),
            recv_cq: CqId((*i.recv_cq).handle),
            srq: (!i.srq.is_null()).then(|| SrqId((*i.srq).handle)),
            caps,
            sq_sig_all: i.sq_sig_all != 0,
        };
        let mut cl = client(ctx);
        let created = cl.create_qp(&qi);
        or_null(created, |qpn| {
            // The capabilities actually provided go back to the caller (verbs semantics).
            if let Ok(info) = cl.query_qp(qpn) {
                i.cap.max_send_wr = info.caps.max_send_wr;
                i.cap.max_recv_wr = info.caps.max_recv_wr;
                i.cap.max_send_sge = info.caps.max_send_sge;
                i.cap.max_recv_sge = info.caps.max_recv_sge;
                i.cap.max_inline_data = info.caps.max_inline_data;
            }
            drop(cl);
            // SAFETY: zero is a valid ibv_qp.
            let mut ibv: sys::ibv_qp = std::mem::zeroed();
            ibv.context = (*pd).context;
            ibv.qp_context = i.qp_context;
            ibv.pd = pd;
            ibv.send_cq = i.send_cq;
            ibv.recv_cq = i.recv_cq;
            ibv.srq = i.srq;
            ibv.handle = qpn.value();
            ibv.qp_num = qpn.value();
            ibv.state = sys::IBV_QPS_RESET;
            ibv.qp_type = i.qp_type;
            // SAFETY: zero is a valid ibv_qp_ex (NULL function pointers until the wr API is
            // enabled by create_qp_ex).
            let mut ex: sys::ibv_qp_ex = std::mem::zeroed();
            ex.qp_base = ibv;
            enlist(
                ctx,
                Qp {
                    ex,
                    qpn,
                    wr_api: false,
                    send_ops: 0,
                    max_send_wr: i.cap.max_send_wr,
                    batch: Default::default(),
                    batch_owner: AtomicU64::new(0),
                    async_events: Default::default(),
                },
            )
        })
    })
}
version!(ibv_create_qp, "IBVERBS_1.1");

pub(crate) fn av_of(ah: &sys::ibv_ah_attr) -> AddressVector {
    AddressVector {
        // SAFETY: reading the raw bytes of a GID union.
        dgid: Gid(unsafe { ah.grh.dgid.raw }),
        sgid_index: ah.grh.sgid_index,
        flow_label: ah.grh.flow_label,
        hop_limit: ah.grh.hop_limit,
        traffic_class: ah.grh.traffic_class,
        sl: ah.sl,
        dmac: None,
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_modify_qp(
    qp: *mut sys::ibv_qp,
    attr: *mut sys::ibv_qp_attr,
    mask: c_int,
) -> c_int {
    let Some(ctx) = owner_ctx(qp).filter(|_| !attr.is_null()) else {
        return libc::EINVAL;
    };
    let a = &*attr;
    let fields = roce::ibv_qp_attr_of!(*a, a.ah_attr.is_global != 0, av_of(&a.ah_attr));
    let q = match QpAttr::from_ibv(mask as u32, &fields) {
        Ok(q) => q,
        Err(e) if e.is_unsupported() => {
            explain(&VerbsError::InvalidArgument(format!("ibv_modify_qp: {e}")));
            return libc::EOPNOTSUPP;
        }
        Err(e) => return invalid(&format!("ibv_modify_qp: {e}")),
    };
    status(client(ctx).modify_qp((*(qp as *mut Qp)).qpn, &q), |()| {
        if let Some(s) = q.state {
            (*qp).state = s.to_ibv();
        }
    })
}
version!(ibv_modify_qp, "IBVERBS_1.1");

#[no_mangle]
pub unsafe extern "C" fn ibv_query_qp(
    qp: *mut sys::ibv_qp,
    attr: *mut sys::ibv_qp_attr,
    _mask: c_int,
    init: *mut sys::ibv_qp_init_attr,
) -> c_int {
    let Some(ctx) = owner_ctx(qp).filter(|_| !attr.is_null()) else {
        return libc::EINVAL;
    };
    let info = match client(ctx).query_qp((*(qp as *mut Qp)).qpn) {
        Ok(i) => i,
        Err(e) => return errno_of(&e),
    };
    let a = &info.attr;
    // SAFETY: zero is a valid ibv_qp_attr.
    let mut o: sys::ibv_qp_attr = std::mem::zeroed();
    let st = info.state.to_ibv();
    o.qp_state = st;
    o.cur_qp_state = st;
    o.sq_draining = info.sq_draining as u8;
    o.path_mtu = a.path_mtu.map_or(0, |m| m as u32);
    o.qkey = a.qkey.map_or(0, |k| k.0);
    o.rq_psn = a.rq_psn.map_or(0, |p| p.value());
    o.sq_psn = a.sq_psn.map_or(0, |p| p.value());
    o.dest_qp_num = a.dest_qp.map_or(0, |q| q.value());
    o.qp_access_flags = a.access.map_or(0, |x| x.0);
    o.cap = sys::ibv_qp_cap {
        max_send_wr: info.caps.max_send_wr,
        max_recv_wr: info.caps.max_recv_wr,
        max_send_sge: info.caps.max_send_sge,
        max_recv_sge: info.caps.max_recv_sge,
        max_inline_data: info.caps.max_inline_data,
    };
    if let Some(av) = a.av {
        o.ah_attr.is_global = 1;
        o.ah_attr.grh.dgid.raw = av.dgid.0;
        o.ah_attr.grh.sgid_index = av.sgid_index;
        o.ah_attr.grh.flow_label = av.flow_label;
        o.ah_attr.grh.hop_limit = av.hop_limit;
        o.ah_attr.grh.traffic_class = av.traffic_class;
        o.ah_attr.sl = av.sl;
        o.ah_attr.port_num = 1;
    }
    o.pkey_index = a.pkey_index.unwrap_or(0);
    o.en_sqd_async_notify = a.en_sqd_async_notify.unwrap_or(false) as u8;
    o.max_rd_atomic = a.max_rd_atomic.unwrap_or(0);
    o.max_dest_rd_atomic = a.max_dest_rd_atomic.unwrap_or(0);
    o.min_rnr_timer = a.min_rnr_timer.unwrap_or(0);
    o.port_num = a.port.unwrap_or(1);
    o.timeout = a.timeout.unwrap_or(0);
    o.retry_cnt = a.retry_cnt.unwrap_or(0);
    o.rnr_retry = a.rnr_retry.unwrap_or(0);
    *attr = o;
    (*qp).state = st;
    if !init.is_null() {
        let i = &mut *init;
        i.qp_context = (*qp).qp_context;
        i.send_cq = (*qp).send_cq;
        i.recv_cq = (*qp).recv_cq;
        i.srq = (*qp).srq;
        i.cap = o.cap;
        i.qp_type = (*qp).qp_type;
        i.sq_sig_all = info.sq_sig_all as c_int;
    }
    0
}
version!(ibv_query_qp, "IBVERBS_1.1");

#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_qp(qp: *mut sys::ibv_qp) -> c_int {
    destroy_acked::<Qp>(qp)
}
version!(ibv_destroy_qp, "IBVERBS_1.1");

/// `ibv_qp_to_qp_ex`: the QP's `ibv_qp_ex` if it was created by `ibv_create_qp_ex` with
/// `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS` (as libibverbs), else NULL.
#[no_mangle]
pub unsafe extern "C" fn ibv_qp_to_qp_ex(qp: *mut sys::ibv_qp) -> *mut sys::ibv_qp_ex {
    if qp.is_null() || !(*(qp as *mut Qp)).wr_api {
        return std::ptr::null_mut();
    }
    &mut (*(qp as *mut Qp)).ex
}
version!(ibv_qp_to_qp_ex, "IBVERBS_1.6");

/// The `send_ops_flags` the `ibv_wr_*` API implements: the operations of `wr_ops!` and
/// `ibv_wr_bind_mw` (no TSO, atomic write or flush: ferroce's engine has none of them).
pub(crate) const SEND_OPS: u64 = WR_OPS | sys::IBV_QP_EX_WITH_BIND_MW as u64;

/// `verbs_context.create_qp_ex` (`ibv_create_qp_ex`): a PD is required; XRC, TSO, RSS,
/// creation flags and unsupported send operations are EOPNOTSUPP, as a provider answers.
pub(crate) unsafe extern "C" fn create_qp_ex(
    c: *mut sys::ibv_context,
    attr: *mut sys::ibv_qp_init_attr_ex,
) -> *mut sys::ibv_qp {
    if attr.is_null() || ctx_of(c).is_none() {
        return null_errno(libc::EINVAL);
    }
    let a = &*attr;
    let known = sys::IBV_QP_INIT_ATTR_PD
        | sys::IBV_QP_INIT_ATTR_SEND_OPS_FLAGS
        | sys::IBV_QP_INIT_ATTR_CREATE_FLAGS;
    if a.comp_mask & sys::IBV_QP_INIT_ATTR_PD == 0 || a.pd.is_null() {
        return null_errno(libc::EINVAL);
    }
    let ops = if a.comp_mask & sys::IBV_QP_INIT_ATTR_SEND_OPS_FLAGS != 0 {
        Some(a.send_ops_flags)
    } else {
        None
    };
    if a.comp_mask & !known != 0
        || (a.comp_mask & sys::IBV_QP_INIT_ATTR_CREATE_FLAGS != 0 && a.create_flags != 0)
        || ops.is_some_and(|o| o & !SEND_OPS != 0)
    {
        return null_errno(libc::EOPNOTSUPP);
    }
    if (*a.pd).context != c {
        return null_errno(libc::EINVAL);
    }
    // The ex attributes begin with ibv_qp_init_attr's fields (the header's own cast).
    let qp = ibv_create_qp(a.pd, attr as *mut sys::ibv_qp_init_attr);
    if let (false, Some(o)) = (qp.is_null(), ops) {
        let q = &mut *(qp as *mut Qp);
        q.wr_api = true;
        q.send_ops = o;
        let x = &mut q.ex;
        x.wr_start = Some(wr_start);
        x.wr_complete = Some(wr_complete);
        x.wr_abort = Some(wr_abort);
        x.wr_rdma_write = Some(wr_rdma_write);
        x.wr_rdma_write_imm = Some(wr_rdma_write_imm);
        x.wr_send = Some(wr_send);
        x.wr_send_imm = Some(wr_send_imm);
        x.wr_send_inv = Some(wr_send_inv);
        x.wr_rdma_read = Some(wr_rdma_read);
        x.wr_atomic_cmp_swp = Some(wr_atomic_cmp_swp);
        x.wr_atomic_fetch_add = Some(wr_atomic_fetch_add);
        x.wr_local_inv = Some(wr_local_inv);
        x.wr_set_sge = Some(wr_set_sge);
        x.wr_set_sge_list = Some(wr_set_sge_list);
        x.wr_set_inline_data = Some(wr_set_inline_data);
        x.wr_set_inline_data_list = Some(wr_set_inline_data_list);
        x.wr_set_ud_addr = Some(wr_set_ud_addr);
        // Not supported, but never a NULL call: each fails the batch with EOPNOTSUPP.
        x.wr_bind_mw = Some(wr_bind_mw);
        x.wr_send_tso = Some(wr_send_tso);
        x.wr_set_xrc_srqn = Some(wr_set_xrc_srqn);
        x.wr_atomic_write = Some(wr_atomic_write);
    }
    qp
}
