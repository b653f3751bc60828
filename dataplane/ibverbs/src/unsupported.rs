//! Verbs ferroce does not offer, answering as libibverbs does for a device without them.

use super::*;

/// Defines exported verbs that answer EOPNOTSUPP whatever their arguments.
macro_rules! eopnotsupp {
    ($($(#[$doc:meta])* $name:ident($($arg:ident: $ty:ty),*), $node:literal;)*) => {$(
        $(#[$doc])*
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> c_int {
            libc::EOPNOTSUPP
        }
        version!($name, $node);
    )*};
}

eopnotsupp! {
    /// Multicast groups are not supported (UD QPs reach unicast GIDs only): EOPNOTSUPP, and
    /// the device advertises `max_mcast_grp` 0.
    ibv_attach_mcast(_qp: *mut sys::ibv_qp, _gid: *const sys::ibv_gid, _lid: u16), "IBVERBS_1.1";
    /// See [`ibv_attach_mcast`].
    ibv_detach_mcast(_qp: *mut sys::ibv_qp, _gid: *const sys::ibv_gid, _lid: u16), "IBVERBS_1.1";
    /// Enhanced connection establishment is not supported: EOPNOTSUPP, as libibverbs
    /// answers for a provider without it (librdmacm then connects without ECE).
    ibv_query_ece(_qp: *mut sys::ibv_qp, _ece: *mut sys::ibv_ece), "IBVERBS_1.10";
    /// See [`ibv_query_ece`].
    ibv_set_ece(_qp: *mut sys::ibv_qp, _ece: *mut sys::ibv_ece), "IBVERBS_1.10";
    /// L2 addresses of a GID come from the kernel's neighbour table, which ferroce's ports
    /// are not in (rnicd resolves them itself): EOPNOTSUPP.
    ibv_resolve_eth_l2_from_gid(
        _c: *mut sys::ibv_context,
        _attr: *mut sys::ibv_ah_attr,
        _mac: *mut u8,
        _vid: *mut u16
    ), "IBVERBS_1.1";
}

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

/// Defines, for each kind of object, its `ibv_import_*` (NULL, EOPNOTSUPP) and its
/// `ibv_unimport_*` (nothing to release: nothing can have been imported).
macro_rules! no_import {
    ($($import:ident($from:ty) -> $obj:ty, $unimport:ident, $node:literal;)*) => {$(
        #[no_mangle]
        pub unsafe extern "C" fn $import(_from: *mut $from, _handle: u32) -> *mut $obj {
            null_errno(libc::EOPNOTSUPP)
        }
        version!($import, $node);

        #[no_mangle]
        pub unsafe extern "C" fn $unimport(_obj: *mut $obj) {}
        version!($unimport, $node);
    )*};
}

no_import! {
    ibv_import_pd(sys::ibv_context) -> sys::ibv_pd, ibv_unimport_pd, "IBVERBS_1.10";
    ibv_import_mr(sys::ibv_pd) -> sys::ibv_mr, ibv_unimport_mr, "IBVERBS_1.10";
    ibv_import_dm(sys::ibv_context) -> sys::ibv_dm, ibv_unimport_dm, "IBVERBS_1.13";
}
