//! Shared receive queues.

use super::*;

#[repr(C)]
pub(crate) struct Srq {
    pub(crate) ibv: sys::ibv_srq,
    pub(crate) id: SrqId,
    /// Its asynchronous events (SRQ limit, SRQ error) not yet acknowledged hold its memory.
    pub(crate) async_events: Acks,
}

listed!(Srq, sys::ibv_srq, srqs, |s| s.id.0, |c, s| c.destroy_srq(s.id););

#[no_mangle]
pub unsafe extern "C" fn ibv_create_srq(
    pd: *mut sys::ibv_pd,
    init: *mut sys::ibv_srq_init_attr,
) -> *mut sys::ibv_srq {
    let Some(ctx) = owner_ctx(pd).filter(|_| !init.is_null()) else {
        return null_errno(libc::EINVAL);
    };
    let a = (*init).attr;
    let attr = SrqAttr {
        max_wr: a.max_wr,
        max_sge: a.max_sge.max(1),
        srq_limit: a.srq_limit,
    };
    let mut cl = client(ctx);
    let created = cl.create_srq((*(pd as *mut Pd)).id, &attr);
    or_null(created, |id| {
        if let Ok(got) = cl.query_srq(id) {
            (*init).attr.max_wr = got.max_wr;
            (*init).attr.max_sge = got.max_sge;
        }
        drop(cl);
        // SAFETY: zero is a valid ibv_srq.
        let mut ibv: sys::ibv_srq = std::mem::zeroed();
        ibv.context = (*pd).context;
        ibv.srq_context = (*init).srq_context;
        ibv.pd = pd;
        ibv.handle = id.0;
        let async_events = Default::default();
        enlist(
            ctx,
            Srq {
                ibv,
                id,
                async_events,
            },
        )
    })
}
version!(ibv_create_srq, "IBVERBS_1.1");

#[no_mangle]
pub unsafe extern "C" fn ibv_modify_srq(
    srq: *mut sys::ibv_srq,
    attr: *mut sys::ibv_srq_attr,
    mask: c_int,
) -> c_int {
    let Some(ctx) = owner_ctx(srq).filter(|_| !attr.is_null()) else {
        return libc::EINVAL;
    };
    // IBV_SRQ_MAX_WR (resize) is not supported; IBV_SRQ_LIMIT arms the limit event.
    if mask & 1 != 0 {
        return libc::EOPNOTSUPP;
    }
    if mask & 2 == 0 {
        return 0;
    }
    status(
        client(ctx).modify_srq((*(srq as *mut Srq)).id, (*attr).srq_limit),
        |()| (),
    )
}
version!(ibv_modify_srq, "IBVERBS_1.1");

#[no_mangle]
pub unsafe extern "C" fn ibv_query_srq(
    srq: *mut sys::ibv_srq,
    attr: *mut sys::ibv_srq_attr,
) -> c_int {
    let Some(ctx) = owner_ctx(srq).filter(|_| !attr.is_null()) else {
        return libc::EINVAL;
    };
    status(client(ctx).query_srq((*(srq as *mut Srq)).id), |a| {
        *attr = sys::ibv_srq_attr {
            max_wr: a.max_wr,
            max_sge: a.max_sge,
            srq_limit: a.srq_limit,
        };
    })
}
version!(ibv_query_srq, "IBVERBS_1.1");

#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_srq(srq: *mut sys::ibv_srq) -> c_int {
    destroy_acked::<Srq>(srq)
}
version!(ibv_destroy_srq, "IBVERBS_1.1");
