//! Memory windows: allocation, `ibv_bind_mw` (type 1) and the bind operation the
//! `IBV_WR_BIND_MW` paths share.

use super::*;

/// The bind of window `mw` to `info` with new key `rkey`, or `None` for NULL arguments or an
/// MR missing where a length needs one.
pub(crate) unsafe fn bind_op(
    mw: *mut sys::ibv_mw,
    rkey: u32,
    info: *const sys::ibv_mw_bind_info,
) -> Option<WrOp> {
    if mw.is_null() || info.is_null() {
        return None;
    }
    let i = &*info;
    let mr = if i.mr.is_null() {
        if i.length != 0 {
            return None;
        }
        Lkey(0)
    } else {
        Lkey((*i.mr).lkey)
    };
    let f = ibv::IbvSendFields {
        bind: ibv::IbvBind {
            mw: (*mw).rkey,
            rkey,
            mr: mr.0,
            addr: i.addr,
            length: i.length,
            access: i.mw_access_flags,
        },
        ..Default::default()
    };
    WrOp::from_ibv(ibv::wr_opcode::BIND_MW, &f).ok()
}

/// `context->ops.alloc_mw` (`ibv_alloc_mw`): type 1 or 2, else EINVAL (as uverbs answers).
pub(crate) unsafe extern "C" fn alloc_mw(
    pd: *mut sys::ibv_pd,
    ty: sys::ibv_mw_type,
) -> *mut sys::ibv_mw {
    guard(std::ptr::null_mut(), || {
        let Some(ctx) = owner_ctx(pd) else {
            return null_errno(libc::EINVAL);
        };
        let t = match ty {
            sys::IBV_MW_TYPE_1 => ferroce_host::MwType::One,
            sys::IBV_MW_TYPE_2 => ferroce_host::MwType::Two,
            _ => return null_errno(libc::EINVAL),
        };
        let r = client(ctx).alloc_mw((*(pd as *mut Pd)).id, t);
        or_null(r, |k| {
            Box::into_raw(Box::new(sys::ibv_mw {
                context: (*pd).context,
                pd,
                rkey: k.0,
                handle: k.0 >> 8,
                type_: ty,
            }))
        })
    })
}

/// `context->ops.dealloc_mw` (`ibv_dealloc_mw`): unbinds a bound window.
pub(crate) unsafe extern "C" fn dealloc_mw(mw: *mut sys::ibv_mw) -> c_int {
    with_obj(mw, |ctx, mw: *mut sys::ibv_mw| {
        let r = client(ctx).dealloc_mw(Rkey((*mw).rkey));
        status(r, |()| drop(Box::from_raw(mw)))
    })
}

/// `context->ops.bind_mw` (`ibv_bind_mw`, type 1; libibverbs' inline checked the type, the
/// MR and the PD): posts the bind as a work request on `qp`'s send queue with the window's
/// next key (`ibv_inc_rkey`) and sets `mw->rkey` to it at once, as rdma-core's rxe
/// provider does: if the bind's completion is an error, the application restores the old
/// key (ibv_bind_mw(3)). A zero-based type 1 window is EINVAL.
pub(crate) unsafe extern "C" fn bind_mw(
    qp: *mut sys::ibv_qp,
    mw: *mut sys::ibv_mw,
    mw_bind: *mut sys::ibv_mw_bind,
) -> c_int {
    guard(libc::EINVAL, || {
        if qp.is_null() || mw.is_null() || mw_bind.is_null() {
            return libc::EINVAL;
        }
        let b = &*mw_bind;
        if b.bind_info.mw_access_flags & sys::IBV_ACCESS_ZERO_BASED != 0 {
            return libc::EINVAL;
        }
        let Some(ctx) = ctx_of((*qp).context) else {
            return libc::EINVAL;
        };
        let old = (*mw).rkey;
        let new = (old & !0xff) | (old.wrapping_add(1) & 0xff);
        let Some(op) = bind_op(mw, new, &b.bind_info) else {
            return libc::EINVAL;
        };
        let qpn = (*(qp as *mut Qp)).qpn;
        let mut cl = client(ctx);
        let flags = SendFlags(b.send_flags & 0xf);
        let e = submit(&mut cl, qpn, b.wr_id, op, &[], flags, None, None);
        if e == 0 {
            (*mw).rkey = new;
        }
        e
    })
}
