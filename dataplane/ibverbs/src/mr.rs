//! Protection domains and memory regions: registration in place, rereg, fork support.

use super::*;

#[repr(C)]
pub(crate) struct Pd {
    pub(crate) ibv: sys::ibv_pd,
    pub(crate) id: PdId,
    /// Address handles on this PD: they live in the library, not in rnicd, so the library
    /// answers EBUSY for `ibv_dealloc_pd` while there are any (as the kernel does).
    pub(crate) ahs: std::sync::atomic::AtomicU32,
}

#[repr(C)]
pub(crate) struct Mr {
    pub(crate) ibv: sys::ibv_mr,
    pub(crate) mr: ferroce_host::Mr,
    /// The access flags registered (for `ibv_rereg_mr` without CHANGE_ACCESS).
    pub(crate) access: c_int,
}

#[no_mangle]
pub unsafe extern "C" fn ibv_alloc_pd(c: *mut sys::ibv_context) -> *mut sys::ibv_pd {
    let Some(ctx) = ctx_of(c) else {
        return null_errno(libc::EINVAL);
    };
    or_null(client(ctx).alloc_pd(), |id| {
        let pd = Box::new(Pd {
            ibv: sys::ibv_pd {
                context: c,
                handle: id.0,
            },
            id,
            ahs: Default::default(),
        });
        Box::into_raw(pd) as *mut sys::ibv_pd
    })
}
version!(ibv_alloc_pd, "IBVERBS_1.1");

#[no_mangle]
pub unsafe extern "C" fn ibv_dealloc_pd(pd: *mut sys::ibv_pd) -> c_int {
    with_obj(pd, |ctx, p: *mut Pd| {
        if (*p).ahs.load(Ordering::Acquire) > 0 {
            return libc::EBUSY;
        }
        status(client(ctx).dealloc_pd((*p).id), |()| drop(Box::from_raw(p)))
    })
}
version!(ibv_dealloc_pd, "IBVERBS_1.1");

/// The access an `ibv_reg_mr` flag word asks for, or `Err` for flags ferroce does not
/// implement (zero-based, on-demand paging...). Bits 20-29 (IBV_ACCESS_OPTIONAL_RANGE:
/// relaxed ordering and later hints) are optional: a device without them ignores them, as
/// rdma-core's providers do.
pub(crate) fn mr_access(access: c_int) -> Result<Access, ()> {
    let optional =
        ((sys::IBV_ACCESS_OPTIONAL_FIRST << 10) - 1) & !(sys::IBV_ACCESS_OPTIONAL_FIRST - 1);
    if access as u32 & !(Access::ALL.0 | optional) != 0 {
        return Err(());
    }
    Ok(Access(access as u32 & Access::ALL.0))
}

/// Registers `len` bytes at `addr` in place, for each `ibv_reg_mr*`: an IOVA other than the
/// address is EOPNOTSUPP.
pub(crate) unsafe fn reg(
    pd: *mut sys::ibv_pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: c_int,
) -> *mut sys::ibv_mr {
    guard(std::ptr::null_mut(), || {
        let Some(ctx) = owner_ctx(pd).filter(|_| !addr.is_null() && len > 0) else {
            return null_errno(libc::EINVAL);
        };
        let Ok(acc) = mr_access(access) else {
            return null_errno(libc::EOPNOTSUPP);
        };
        if iova != addr as u64 {
            return null_errno(libc::EOPNOTSUPP);
        }
        let p = pd as *mut Pd;
        let r = while_moving(|| client(ctx).reg_mr_addr((*p).id, addr as u64, len, acc));
        or_null(r, |m| {
            Box::into_raw(Box::new(Mr {
                ibv: sys::ibv_mr {
                    context: (*pd).context,
                    pd,
                    addr,
                    length: len,
                    handle: m.lkey.0,
                    lkey: m.lkey.0,
                    rkey: m.rkey.map_or(m.lkey.0, |k| k.0),
                },
                mr: m,
                access,
            })) as *mut sys::ibv_mr
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr(
    pd: *mut sys::ibv_pd,
    addr: *mut c_void,
    len: usize,
    access: c_int,
) -> *mut sys::ibv_mr {
    reg(pd, addr, len, addr as u64, access)
}
version!(ibv_reg_mr, "IBVERBS_1.1");

#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr_iova(
    pd: *mut sys::ibv_pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: c_int,
) -> *mut sys::ibv_mr {
    reg(pd, addr, len, iova, access)
}
version!(ibv_reg_mr_iova, "IBVERBS_1.7");

#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr_iova2(
    pd: *mut sys::ibv_pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: c_uint,
) -> *mut sys::ibv_mr {
    reg(pd, addr, len, iova, access as c_int)
}
version!(ibv_reg_mr_iova2, "IBVERBS_1.8");

#[no_mangle]
pub unsafe extern "C" fn ibv_dereg_mr(mr: *mut sys::ibv_mr) -> c_int {
    with_obj(mr, |ctx, m: *mut Mr| {
        // The last registration within its pages moves them back to private memory.
        let r = while_moving(|| client(ctx).dereg_mr(&(*m).mr));
        status(r, |()| drop(Box::from_raw(m)))
    })
}
version!(ibv_dereg_mr, "IBVERBS_1.1");

/// `ibv_rereg_mr`: changes an MR's translation, PD and/or access in place, keeping its lkey
/// and rkey (as mlx5 does: programs and test suites written for hardware rely on it). It is
/// a new registration for the engine, so a peer's operation in progress against the old
/// translation fails rather than reaching it. On failure the MR is as it was
/// (`IBV_REREG_MR_ERR_CMD`, or `_ERR_INPUT` for bad arguments; errno set with each).
#[no_mangle]
pub unsafe extern "C" fn ibv_rereg_mr(
    mr: *mut sys::ibv_mr,
    flags: c_int,
    pd: *mut sys::ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> c_int {
    guard(sys::IBV_REREG_MR_ERR_CMD, || {
        // rdma-core sets errno with each error code it returns.
        let input = |e| {
            set_errno(e);
            sys::IBV_REREG_MR_ERR_INPUT
        };
        let Some(ctx) = owner_ctx(mr)
            .filter(|_| flags != 0 && flags as u32 & !sys::IBV_REREG_MR_FLAGS_SUPPORTED == 0)
        else {
            return input(libc::EINVAL);
        };
        let m = &mut *(mr as *mut Mr);
        let f = flags as u32;
        let new_pd = if f & sys::IBV_REREG_MR_CHANGE_PD != 0 {
            if pd.is_null() || (*pd).context != m.ibv.context {
                return input(libc::EINVAL);
            }
            Some(pd)
        } else {
            None
        };
        let memory = if f & sys::IBV_REREG_MR_CHANGE_TRANSLATION != 0 {
            if addr.is_null() || length == 0 {
                return input(libc::EINVAL);
            }
            Some((addr as u64, length))
        } else {
            None
        };
        let acc = if f & sys::IBV_REREG_MR_CHANGE_ACCESS != 0 {
            match mr_access(access) {
                Ok(a) => Some(a),
                Err(()) => return input(libc::EOPNOTSUPP),
            }
        } else {
            None
        };
        // Pages may move (the new range onto a memfd, the old one back).
        let new_pd_id = new_pd.map(|p| (*(p as *mut Pd)).id);
        let r = while_moving(|| client(ctx).rereg_mr(&m.mr, new_pd_id, memory, acc));
        match r {
            Ok(new) => {
                m.mr = new;
                if let Some(p) = new_pd {
                    m.ibv.pd = p;
                }
                if let Some((a, l)) = memory {
                    m.ibv.addr = a as *mut c_void;
                    m.ibv.length = l;
                }
                if acc.is_some() {
                    m.access = access;
                }
                m.ibv.lkey = new.lkey.0;
                m.ibv.rkey = new.rkey.map_or(new.lkey.0, |k| k.0);
                0
            }
            Err(e) => {
                set_errno(errno_of(&e));
                sys::IBV_REREG_MR_ERR_CMD
            }
        }
    })
}
version!(ibv_rereg_mr, "IBVERBS_1.1");

/// dma-buf memory (a device's memory exported to the RNIC) has no meaning for a software
/// RNIC: NULL, EOPNOTSUPP.
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_dmabuf_mr(
    _pd: *mut sys::ibv_pd,
    _offset: u64,
    _length: usize,
    _iova: u64,
    _fd: c_int,
    _access: c_int,
) -> *mut sys::ibv_mr {
    null_errno(libc::EOPNOTSUPP)
}
version!(ibv_reg_dmabuf_mr, "IBVERBS_1.12");

pub(crate) static FORK_INIT: AtomicBool = AtomicBool::new(false);

/// Fork protection. rdma-core marks registered pages MADV_DONTFORK so that a child's
/// copy-on-write cannot take the physical pages the HCA writes to away from the parent.
/// ferroce has no pinned pages: registration moves the pages onto a sealed memfd mapped
/// MAP_SHARED at the same address (the engine in rnicd maps the same file), so the parent's
/// RDMA keeps working after fork with or without this call, and a `pthread_atfork` child
/// handler turns every moved range into a private copy in the child (`ferroce_host::app::shadow`), as
/// ordinary memory would be. The difference a program may see: the child has its copy of
/// registered pages where DONTFORK would leave them unmapped. The call is remembered for
/// `ibv_is_fork_initialized`; see docs/ibverbs.md.
#[no_mangle]
pub unsafe extern "C" fn ibv_fork_init() -> c_int {
    FORK_INIT.store(true, Ordering::Relaxed);
    0
}
version!(ibv_fork_init, "IBVERBS_1.1");

#[no_mangle]
pub extern "C" fn ibv_is_fork_initialized() -> c_uint {
    if FORK_INIT.load(Ordering::Relaxed) {
        sys::IBV_FORK_ENABLED
    } else {
        sys::IBV_FORK_DISABLED
    }
}
version!(ibv_is_fork_initialized, "IBVERBS_1.13");

/// See [`ibv_fork_init`]: no pages are pinned, so there is nothing to mark.
#[no_mangle]
pub unsafe extern "C" fn ibv_dontfork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}
version!(ibv_dontfork_range, "IBVERBS_1.1");

/// See [`ibv_fork_init`]: no pages are pinned, so there is nothing to mark.
#[no_mangle]
pub unsafe extern "C" fn ibv_dofork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}
version!(ibv_dofork_range, "IBVERBS_1.1");
