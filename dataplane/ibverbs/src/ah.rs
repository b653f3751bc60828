//! Address handles, also from a received work completion.

use super::*;

#[repr(C)]
pub(crate) struct Ah {
    pub(crate) ibv: sys::ibv_ah,
    pub(crate) av: AddressVector,
}

#[no_mangle]
pub unsafe extern "C" fn ibv_create_ah(
    pd: *mut sys::ibv_pd,
    attr: *mut sys::ibv_ah_attr,
) -> *mut sys::ibv_ah {
    if pd.is_null() || attr.is_null() {
        return null_errno(libc::EINVAL);
    }
    if (*attr).is_global == 0 {
        // RoCE needs the GRH (the GID) to reach a peer.
        return null_errno(invalid(
            "ibv_create_ah: is_global is 0, but RoCE addresses the peer by its GID: set \
             is_global = 1, grh.dgid and grh.sgid_index",
        ));
    }
    // One port, and a source GID the port has.
    let mut g: sys::ibv_gid = std::mem::zeroed();
    if ctx_of((*pd).context).is_none()
        || (*attr).port_num != 1
        || ibv_query_gid((*pd).context, 1, (*attr).grh.sgid_index as c_int, &mut g) != 0
        || g.raw == [0; 16]
    {
        return null_errno(libc::EINVAL);
    }
    (*(pd as *mut Pd)).ahs.fetch_add(1, Ordering::AcqRel);
    Box::into_raw(Box::new(Ah {
        ibv: sys::ibv_ah {
            context: (*pd).context,
            pd,
            handle: 0,
        },
        av: av_of(&*attr),
    })) as *mut sys::ibv_ah
}
version!(ibv_create_ah, "IBVERBS_1.1");

#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_ah(ah: *mut sys::ibv_ah) -> c_int {
    if ah.is_null() {
        return libc::EINVAL;
    }
    let pd = (*ah).pd as *mut Pd;
    if !pd.is_null() {
        (*pd).ahs.fetch_sub(1, Ordering::AcqRel);
    }
    drop(Box::from_raw(ah as *mut Ah));
    0
}
version!(ibv_destroy_ah, "IBVERBS_1.1");

/// Fills an address handle that answers the sender of a UD receive, from the 40-byte GRH area
/// at the start of the receive buffer: for RoCEv2 over IPv6 the IPv6 header, over IPv4 20
/// bytes of padding and then the IPv4 header (as rxe and rdma-core's
/// `get_grh_header_version` lay it out). The reply goes to the packet's source as an
/// IPv4-mapped or IPv6 GID, from our GID the packet was sent to (its index; ENOENT if it is
/// not in our table). RoCE is Ethernet, so the GRH area is always read, as rdma-core does.
#[no_mangle]
pub unsafe extern "C" fn ibv_init_ah_from_wc(
    c: *mut sys::ibv_context,
    port: u8,
    wc: *mut sys::ibv_wc,
    grh: *mut sys::ibv_grh,
    attr: *mut sys::ibv_ah_attr,
) -> c_int {
    // ibv_create_ah_from_wc(3): 0 on success, -1 on error (errno says which).
    let fail = |e: c_int| {
        set_errno(e);
        -1
    };
    if ctx_of(c).is_none() || wc.is_null() || attr.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: zero is a valid ibv_ah_attr.
    let mut a: sys::ibv_ah_attr = std::mem::zeroed();
    a.port_num = port;
    a.dlid = (*wc).slid;
    a.sl = (*wc).sl;
    a.src_path_bits = (*wc).dlid_path_bits;
    // Without a GRH the address is not global and the GRH area is not read (rdma-core).
    if (*wc).wc_flags & sys::IBV_WC_GRH == 0 {
        *attr = a;
        return 0;
    }
    if grh.is_null() {
        return fail(libc::EINVAL);
    }
    let raw = std::slice::from_raw_parts(grh as *const u8, 40);
    let mapped = |a: &[u8]| {
        let mut g = [0u8; 16];
        g[10] = 0xff;
        g[11] = 0xff;
        g[12..].copy_from_slice(&a[..4]);
        g
    };
    // (destination = the sender, our GID it was sent to, traffic class, flow label, hop
    // limit: the IPv6 header's or the IPv4 TTL, as rdma-core takes them)
    let (dgid, ours, tclass, flow, hops) = if raw[0] >> 4 == 6 {
        let g = &*grh;
        let vcf = u32::from_be(g.version_tclass_flow);
        (
            g.sgid.raw,
            g.dgid.raw,
            ((vcf >> 20) & 0xff) as u8,
            vcf & 0xfffff,
            g.hop_limit,
        )
    } else if raw[20] == 0x45 {
        // IPv4 header without options: TOS at 1, TTL at 8, source at 12, destination at 16.
        let h = &raw[20..];
        (mapped(&h[12..16]), mapped(&h[16..20]), h[1], 0, h[8])
    } else {
        return fail(libc::EINVAL);
    };
    let mut idx = None;
    for i in 0..=u8::MAX {
        let mut mine: sys::ibv_gid = std::mem::zeroed();
        if ibv_query_gid(c, port, i as c_int, &mut mine) != 0 {
            break;
        }
        if mine.raw == ours {
            idx = Some(i);
            break;
        }
    }
    let Some(idx) = idx else {
        return fail(libc::ENOENT);
    };
    a.is_global = 1;
    a.grh.dgid.raw = dgid;
    a.grh.sgid_index = idx;
    a.grh.hop_limit = hops;
    a.grh.traffic_class = tclass;
    a.grh.flow_label = flow;
    *attr = a;
    0
}
version!(ibv_init_ah_from_wc, "IBVERBS_1.1");

#[no_mangle]
pub unsafe extern "C" fn ibv_create_ah_from_wc(
    pd: *mut sys::ibv_pd,
    wc: *mut sys::ibv_wc,
    grh: *mut sys::ibv_grh,
    port: u8,
) -> *mut sys::ibv_ah {
    if pd.is_null() {
        return null_errno(libc::EINVAL);
    }
    let mut a: sys::ibv_ah_attr = std::mem::zeroed();
    // It sets errno on failure, which the NULL returned here keeps.
    if ibv_init_ah_from_wc((*pd).context, port, wc, grh, &mut a) != 0 {
        return std::ptr::null_mut();
    }
    ibv_create_ah(pd, &mut a)
}
version!(ibv_create_ah_from_wc, "IBVERBS_1.1");
