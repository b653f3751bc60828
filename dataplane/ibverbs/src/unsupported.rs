//! Verbs ferroce does not offer, answering as libibverbs does for a device without them.

use super::*;

/// Multicast groups are not supported (UD QPs reach unicast GIDs only): EOPNOTSUPP, and the
/// device advertises `max_mcast_grp` 0.
#[no_mangle]
pub unsafe extern "C" fn ibv_attach_mcast(
    _qp: *mut sys::ibv_qp,
    _gid: *const sys::ibv_gid,
    _lid: u16,
) -> c_int {
    libc::EOPNOTSUPP
}
version!(ibv_attach_mcast, "IBVERBS_1.1");

/// See [`ibv_attach_mcast`].
#[no_mangle]
pub unsafe extern "C" fn ibv_detach_mcast(
    _qp: *mut sys::ibv_qp,
    _gid: *const sys::ibv_gid,
    _lid: u16,
) -> c_int {
    libc::EOPNOTSUPP
}
version!(ibv_detach_mcast, "IBVERBS_1.1");

/// Enhanced connection establishment is not supported: EOPNOTSUPP, as libibverbs answers
/// for a provider without it (librdmacm then connects without ECE).
#[no_mangle]
pub unsafe extern "C" fn ibv_query_ece(_qp: *mut sys::ibv_qp, _ece: *mut sys::ibv_ece) -> c_int {
    libc::EOPNOTSUPP
}
version!(ibv_query_ece, "IBVERBS_1.10");

/// See [`ibv_query_ece`].
#[no_mangle]
pub unsafe extern "C" fn ibv_set_ece(_qp: *mut sys::ibv_qp, _ece: *mut sys::ibv_ece) -> c_int {
    libc::EOPNOTSUPP
}
version!(ibv_set_ece, "IBVERBS_1.10");

/// L2 addresses of a GID come from the kernel's neighbour table, which ferroce's ports are
/// not in (rnicd resolves them itself): EOPNOTSUPP.
#[no_mangle]
pub unsafe extern "C" fn ibv_resolve_eth_l2_from_gid(
    _c: *mut sys::ibv_context,
    _attr: *mut sys::ibv_ah_attr,
    _mac: *mut u8,
    _vid: *mut u16,
) -> c_int {
    libc::EOPNOTSUPP
}
version!(ibv_resolve_eth_l2_from_gid, "IBVERBS_1.1");

/// Whether data of an operation lands in order: no guarantee is made (0), the answer
/// libibverbs gives when the device does not say.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_qp_data_in_order(
    _qp: *mut sys::ibv_qp,
    _op: c_uint,
    _flags: u32,
) -> c_int {
    0
}
version!(ibv_query_qp_data_in_order, "IBVERBS_1.14");

// Sharing objects between processes through a kernel device file: ferroce's objects live
// in rnicd, not behind a uverbs fd, so importing is not supported (NULL, EOPNOTSUPP).

#[no_mangle]
pub unsafe extern "C" fn ibv_import_device(fd: c_int) -> *mut sys::ibv_context {
    // rdma-core answers EOPNOTSUPP for a device without import (its ioctl fails so); a
    // descriptor that is not open at all is EBADF.
    if libc::fcntl(fd, libc::F_GETFD) < 0 {
        return null_errno(libc::EBADF);
    }
    explain(&VerbsError::InvalidArgument(
        "ibv_import_device: ferroce's contexts live in rnicd and cannot be imported from a \
         descriptor; open the device in each process (ibv_open_device)"
            .into(),
    ));
    set_errno(libc::EOPNOTSUPP);
    std::ptr::null_mut()
}
version!(ibv_import_device, "IBVERBS_1.10");

#[no_mangle]
pub unsafe extern "C" fn ibv_import_pd(_c: *mut sys::ibv_context, _h: u32) -> *mut sys::ibv_pd {
    null_errno(libc::EOPNOTSUPP)
}
version!(ibv_import_pd, "IBVERBS_1.10");

#[no_mangle]
pub unsafe extern "C" fn ibv_unimport_pd(_pd: *mut sys::ibv_pd) {}
version!(ibv_unimport_pd, "IBVERBS_1.10");

#[no_mangle]
pub unsafe extern "C" fn ibv_import_mr(_pd: *mut sys::ibv_pd, _h: u32) -> *mut sys::ibv_mr {
    null_errno(libc::EOPNOTSUPP)
}
version!(ibv_import_mr, "IBVERBS_1.10");

#[no_mangle]
pub unsafe extern "C" fn ibv_unimport_mr(_mr: *mut sys::ibv_mr) {}
version!(ibv_unimport_mr, "IBVERBS_1.10");

#[no_mangle]
pub unsafe extern "C" fn ibv_import_dm(_c: *mut sys::ibv_context, _h: u32) -> *mut sys::ibv_dm {
    null_errno(libc::EOPNOTSUPP)
}
version!(ibv_import_dm, "IBVERBS_1.13");

#[no_mangle]
pub unsafe extern "C" fn ibv_unimport_dm(_dm: *mut sys::ibv_dm) {}
version!(ibv_unimport_dm, "IBVERBS_1.13");
