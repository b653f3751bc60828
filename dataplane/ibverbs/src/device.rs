//! Devices: discovery of rnicd's RNICs, the device list, and the device, port, GID and P_Key
//! queries.

use super::*;

/// A device: the application's `ibv_device` first.
#[repr(C)]
pub(crate) struct Device {
    pub(crate) ibv: sys::ibv_device,
    pub(crate) name: String,
    pub(crate) guid: u64,
}

// SAFETY: a device is immutable once listed.
unsafe impl Send for Device {}
unsafe impl Sync for Device {}

/// Devices found so far, never freed (contexts point at them).
pub(crate) static DEVICES: Mutex<Vec<&'static Device>> = Mutex::new(Vec::new());
pub(crate) static WARNED: AtomicBool = AtomicBool::new(false);

pub(crate) fn copy_str(dst: &mut [c_char], s: &str) {
    let room = dst.len().saturating_sub(1);
    for (d, b) in dst.iter_mut().zip(s.bytes().take(room)) {
        *d = b as c_char;
    }
}

pub(crate) fn parse_guid(s: &str) -> u64 {
    u64::from_str_radix(&s.replace(':', ""), 16).unwrap_or(0)
}

/// rnicd's RNICs as devices (connecting for the list each time, as libibverbs rescans).
pub(crate) fn discover() -> Vec<&'static Device> {
    let found = match Admin::connect(None) {
        Ok(mut a) => match a.request(AdminRequest::Devices) {
            Ok(ReplyBody::Devices(d)) => d
                .into_iter()
                .map(|d| (d.name, parse_guid(&d.node_guid)))
                .collect(),
            _ => Vec::new(),
        },
        Err(e) => {
            if !WARNED.swap(true, Ordering::Relaxed) {
                eprintln!("libibverbs (ferroce): {e}");
            }
            Vec::new()
        }
    };
    let mut list = DEVICES.lock().unwrap_or_else(|p| p.into_inner());
    let mut out = Vec::new();
    for (name, guid) in found {
        let dev = match list.iter().find(|d| d.name == name) {
            Some(d) => *d,
            None => {
                // SAFETY: zero is a valid ibv_device (plain C data).
                let mut ibv: sys::ibv_device = unsafe { std::mem::zeroed() };
                ibv.node_type = sys::IBV_NODE_CA;
                ibv.transport_type = sys::IBV_TRANSPORT_IB;
                copy_str(&mut ibv.name, &name);
                // As rdma-core fills them, under ibv_get_sysfs_path() (SYSFS_PATH): where
                // `ferroce-run` shows the device (`rnic-ctl sysfs`), and the character file
                // /dev/infiniband/<dev_name> beside it.
                // SAFETY: a static NUL-terminated string.
                let sysfs = unsafe { CStr::from_ptr(ibv_get_sysfs_path()) }.to_string_lossy();
                let dev_name = format!("uverbs_{name}");
                copy_str(&mut ibv.dev_name, &dev_name);
                copy_str(
                    &mut ibv.dev_path,
                    &format!("{sysfs}/class/infiniband_verbs/{dev_name}"),
                );
                copy_str(
                    &mut ibv.ibdev_path,
                    &format!("{sysfs}/class/infiniband/{name}"),
                );
                let d: &'static Device = Box::leak(Box::new(Device { ibv, name, guid }));
                list.push(d);
                d
            }
        };
        out.push(dev);
    }
    out
}

pub(crate) fn device_of(p: *mut sys::ibv_device) -> Option<&'static Device> {
    let list = DEVICES.lock().unwrap_or_else(|p| p.into_inner());
    list.iter().find(|d| std::ptr::eq(&d.ibv, p)).copied()
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_list(num: *mut c_int) -> *mut *mut sys::ibv_device {
    guard(std::ptr::null_mut(), || {
        let devs = discover();
        // A NULL-terminated array the application frees with ibv_free_device_list.
        let arr = libc::calloc(devs.len() + 1, std::mem::size_of::<*mut sys::ibv_device>())
            as *mut *mut sys::ibv_device;
        if arr.is_null() {
            return null_errno(libc::ENOMEM);
        }
        for (i, d) in devs.iter().enumerate() {
            *arr.add(i) = &d.ibv as *const sys::ibv_device as *mut sys::ibv_device;
        }
        if !num.is_null() {
            *num = devs.len() as c_int;
        }
        if devs.is_empty() {
            set_errno(libc::ENOSYS);
        }
        arr
    })
}
version!(ibv_get_device_list, "IBVERBS_1.1");

#[no_mangle]
pub unsafe extern "C" fn ibv_free_device_list(list: *mut *mut sys::ibv_device) {
    libc::free(list as *mut c_void);
}
version!(ibv_free_device_list, "IBVERBS_1.1");

#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_name(dev: *mut sys::ibv_device) -> *const c_char {
    if dev.is_null() {
        return std::ptr::null();
    }
    (*dev).name.as_ptr()
}
version!(ibv_get_device_name, "IBVERBS_1.1");

#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_guid(dev: *mut sys::ibv_device) -> u64 {
    device_of(dev).map_or(0, |d| d.guid.to_be())
}
version!(ibv_get_device_guid, "IBVERBS_1.1");

#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_index(dev: *mut sys::ibv_device) -> c_int {
    let list = DEVICES.lock().unwrap_or_else(|p| p.into_inner());
    list.iter()
        .position(|d| std::ptr::eq(&d.ibv, dev))
        .map_or(-1, |i| i as c_int)
}
version!(ibv_get_device_index, "IBVERBS_1.9");

#[no_mangle]
pub unsafe extern "C" fn ibv_query_device(
    c: *mut sys::ibv_context,
    attr: *mut sys::ibv_device_attr,
) -> c_int {
    let Some(ctx) = ctx_of(c).filter(|_| !attr.is_null()) else {
        return libc::EINVAL;
    };
    *attr = device_attr(ctx);
    0
}
version!(ibv_query_device, "IBVERBS_1.1");

/// `verbs_context.query_device_ex` (`ibv_query_device_ex`): the legacy attributes, and
/// zero for every extension (no ODP, TSO, RSS, timestamps, packet pacing, tag matching,
/// device memory), which is exactly what ferroce lacks. Writes at most `size` bytes, as the
/// ABI lets an older caller pass a shorter structure.
pub(crate) unsafe extern "C" fn query_device_ex(
    c: *mut sys::ibv_context,
    input: *const sys::ibv_query_device_ex_input,
    attr: *mut sys::ibv_device_attr_ex,
    size: usize,
) -> c_int {
    let Some(ctx) = ctx_of(c) else {
        return libc::EINVAL;
    };
    if attr.is_null() || size < std::mem::size_of::<sys::ibv_device_attr>() {
        return libc::EINVAL;
    }
    if !input.is_null() && (*input).comp_mask != 0 {
        return libc::EINVAL;
    }
    // SAFETY: zero is a valid ibv_device_attr_ex.
    let mut ex: sys::ibv_device_attr_ex = std::mem::zeroed();
    ex.orig_attr = device_attr(ctx);
    ex.device_cap_flags_ex = ex.orig_attr.device_cap_flags as u64;
    ex.phys_port_cnt_ex = 1;
    let n = size.min(std::mem::size_of::<sys::ibv_device_attr_ex>());
    std::ptr::copy_nonoverlapping(&ex as *const _ as *const u8, attr as *mut u8, n);
    0
}

pub(crate) unsafe fn device_attr(ctx: &Ctx) -> sys::ibv_device_attr {
    let a = &ctx.limits;
    let l = &a.limits;
    // SAFETY: zero is a valid ibv_device_attr.
    let mut o: sys::ibv_device_attr = std::mem::zeroed();
    copy_str(&mut o.fw_ver, roce::engine::FW_VERSION);
    o.node_guid = ctx.dev.guid.to_be();
    o.sys_image_guid = ctx.dev.guid.to_be();
    o.max_mr_size = a.max_mr_size;
    o.page_size_cap = 4096;
    o.vendor_id = a.vendor_id;
    o.vendor_part_id = a.vendor_part_id;
    o.max_qp = l.max_qp as c_int;
    o.max_qp_wr = l.max_qp_wr as c_int;
    // Only what works: RNR NAKs are generated, the port-active event exists, cur_state is
    // checked by modify_qp, the system image GUID is the node GUID.
    o.device_cap_flags = sys::IBV_DEVICE_RC_RNR_NAK_GEN
        | sys::IBV_DEVICE_PORT_ACTIVE_EVENT
        | sys::IBV_DEVICE_CURR_QP_STATE_MOD
        | sys::IBV_DEVICE_SYS_IMAGE_GUID
        // Memory windows of type 1 and 2B, as rxe advertises.
        | sys::IBV_DEVICE_MEM_WINDOW
        | sys::IBV_DEVICE_MEM_WINDOW_TYPE_2B;
    o.max_mw = l.max_mw as c_int;
    o.max_sge = l.max_sge as c_int;
    o.max_sge_rd = l.max_sge as c_int;
    o.max_cq = l.max_cq as c_int;
    o.max_cqe = l.max_cqe as c_int;
    o.max_mr = l.max_mr as c_int;
    o.max_pd = l.max_pd as c_int;
    o.max_qp_rd_atom = l.max_qp_rd_atom as c_int;
    o.max_res_rd_atom = (l.max_qp_rd_atom as c_int).saturating_mul(l.max_qp as c_int);
    o.max_qp_init_rd_atom = a.max_qp_init_rd_atom as c_int;
    o.atomic_cap = if a.atomic_cap == 1 {
        sys::IBV_ATOMIC_HCA
    } else {
        sys::IBV_ATOMIC_NONE
    };
    o.max_ah = l.max_qp as c_int;
    o.max_srq = l.max_srq as c_int;
    o.max_srq_wr = a.max_srq_wr as c_int;
    o.max_srq_sge = a.max_srq_sge as c_int;
    o.max_pkeys = 1;
    o.local_ca_ack_delay = 15;
    o.phys_port_cnt = 1;
    o
}

pub(crate) fn port_attr(ctx: &Ctx) -> Result<sys::ibv_port_attr, c_int> {
    let p = client(ctx).query_port().map_err(|e| errno_of(&e))?;
    // SAFETY: zero is a valid ibv_port_attr.
    let mut o: sys::ibv_port_attr = unsafe { std::mem::zeroed() };
    o.state = if p.active {
        sys::IBV_PORT_ACTIVE
    } else {
        sys::IBV_PORT_DOWN
    };
    o.max_mtu = p.max_mtu as u32;
    o.active_mtu = p.active_mtu as u32;
    o.gid_tbl_len = p.gid_tbl_len as c_int;
    o.port_cap_flags = 0x0401_0000; // CM supported | IP based GIDs, as rxe
    o.max_msg_sz = 0x8000_0000;
    o.pkey_tbl_len = p.pkey_tbl_len.min(u16::MAX as u32) as u16;
    o.max_vl_num = 1;
    o.active_width = 2; // 4x
    o.active_speed = 32; // EDR-class, so tools print a speed
    o.phys_state = if p.active { 5 } else { 3 }; // LinkUp / Disabled
    o.link_layer = sys::IBV_LINK_LAYER_ETHERNET as u8;
    Ok(o)
}

/// `verbs_context::query_port`: what `ibv_query_port` (a macro) calls.
pub(crate) unsafe extern "C" fn query_port_ex(
    c: *mut sys::ibv_context,
    port: u8,
    attr: *mut sys::ibv_port_attr,
    len: usize,
) -> c_int {
    let Some(ctx) = ctx_of(c) else {
        return libc::EINVAL;
    };
    if port != 1 || attr.is_null() {
        return libc::EINVAL;
    }
    match port_attr(ctx) {
        Ok(a) => {
            let n = len.min(std::mem::size_of::<sys::ibv_port_attr>());
            std::ptr::copy_nonoverlapping(
                &a as *const sys::ibv_port_attr as *const u8,
                attr as *mut u8,
                n,
            );
            0
        }
        Err(e) => e,
    }
}

/// The exported, older `ibv_query_port` (the `_compat_ibv_port_attr` layout).
#[no_mangle]
pub unsafe extern "C" fn ibv_query_port(
    c: *mut sys::ibv_context,
    port: u8,
    attr: *mut sys::_compat_ibv_port_attr,
) -> c_int {
    // <infiniband/verbs.h> only declares `_compat_ibv_port_attr` (bindgen sizes it 0):
    // rdma-core defines it as `ibv_port_attr` up to, without, `port_cap_flags2`.
    query_port_ex(
        c,
        port,
        attr as *mut sys::ibv_port_attr,
        offset_of!(sys::ibv_port_attr, port_cap_flags2),
    )
}
version!(ibv_query_port, "IBVERBS_1.1");

#[no_mangle]
pub unsafe extern "C" fn ibv_query_gid(
    c: *mut sys::ibv_context,
    port: u8,
    index: c_int,
    gid: *mut sys::ibv_gid,
) -> c_int {
    let Some(ctx) = ctx_of(c) else {
        return -1;
    };
    if port != 1 || gid.is_null() || !(0..=255).contains(&index) {
        return neg1_errno(libc::EINVAL);
    }
    match gid_entry(ctx, index as u8) {
        // An empty entry of the table reads as the zero GID (the kernel's sysfs file of an
        // empty entry); past the table, an error.
        Ok(g) => {
            (*gid).raw = g.unwrap_or([0; 16]);
            0
        }
        Err(()) => neg1_errno(libc::EINVAL),
    }
}
version!(ibv_query_gid, "IBVERBS_1.1");

/// Entry `index` of the port's GID table (populated entries first, then empty ones):
/// `None` for an empty one, `Err` past the table.
pub(crate) fn gid_entry(ctx: &Ctx, index: u8) -> Result<Option<[u8; 16]>, ()> {
    // (The result first: the client's lock must not be held into query_port.)
    let r = client(ctx).query_gid(index);
    match r {
        Ok(g) => Ok(Some(g.0)),
        Err(_)
            if client(ctx)
                .query_port()
                .is_ok_and(|p| u32::from(index) < p.gid_tbl_len) =>
        {
            Ok(None)
        }
        Err(_) => Err(()),
    }
}

/// `ibv_query_gid_type` (libibverbs' private ABI, which librdmacm and pyverbs use): the type
/// of a GID table entry in the sysfs numbering (0: IB or RoCE v1, 1: RoCE v2). Every
/// populated entry of a ferroce port is RoCE v2; an empty one reads as type 0, as rdma-core
/// answers for an empty entry; past the table, -1 with errno EINVAL.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_gid_type(
    c: *mut sys::ibv_context,
    port: u8,
    index: c_uint,
    ty: *mut c_int,
) -> c_int {
    if ty.is_null() {
        return neg1_errno(libc::EINVAL);
    }
    let mut e: sys::ibv_gid_entry = std::mem::zeroed();
    match _ibv_query_gid_ex(c, port as u32, index, &mut e, 0, std::mem::size_of_val(&e)) {
        0 => {
            *ty = 1;
            0
        }
        libc::ENODATA => {
            *ty = 0;
            0
        }
        err => neg1_errno(err),
    }
}
version!(ibv_query_gid_type, "IBVERBS_PRIVATE_34");

#[no_mangle]
pub unsafe extern "C" fn _ibv_query_gid_ex(
    c: *mut sys::ibv_context,
    port: u32,
    index: u32,
    entry: *mut sys::ibv_gid_entry,
    flags: u32,
    len: usize,
) -> c_int {
    if flags != 0 || entry.is_null() || len < std::mem::size_of::<sys::ibv_gid_entry>() {
        return libc::EINVAL;
    }
    let Some(ctx) = ctx_of(c) else {
        return libc::EINVAL;
    };
    if port != 1 || index > 255 {
        return libc::EINVAL;
    }
    // An empty entry: ENODATA (as the kernel answers); past the table: EINVAL.
    let g = match gid_entry(ctx, index as u8) {
        Ok(Some(g)) => sys::ibv_gid { raw: g },
        Ok(None) => return libc::ENODATA,
        Err(()) => return libc::EINVAL,
    };
    *entry = sys::ibv_gid_entry {
        gid: g,
        gid_index: index,
        port_num: port,
        gid_type: sys::IBV_GID_TYPE_ROCE_V2,
        ndev_ifindex: 0,
    };
    0
}
version!(_ibv_query_gid_ex, "IBVERBS_1.11");

/// `ibv_query_gid_table`: every valid GID of the (single) port, as `ibv_query_gid` lists
/// them; the count, or a negative errno.
#[no_mangle]
pub unsafe extern "C" fn _ibv_query_gid_table(
    c: *mut sys::ibv_context,
    entries: *mut sys::ibv_gid_entry,
    max: usize,
    flags: u32,
    size: usize,
) -> isize {
    if ctx_of(c).is_none()
        || flags != 0
        || (max > 0 && entries.is_null())
        || size < std::mem::size_of::<sys::ibv_gid_entry>()
    {
        return -(libc::EINVAL as isize);
    }
    let mut n = 0usize;
    for index in 0..=255u32 {
        let mut g: sys::ibv_gid_entry = std::mem::zeroed();
        match _ibv_query_gid_ex(c, 1, index, &mut g, 0, std::mem::size_of_val(&g)) {
            0 => {}
            libc::ENODATA => continue, // an empty entry: not listed
            _ => break,                // past the table
        }
        if n == max {
            return -(libc::EINVAL as isize);
        }
        // Entries are `size` bytes apart (a caller built against newer headers).
        let dst = (entries as *mut u8).add(n * size) as *mut sys::ibv_gid_entry;
        *dst = g;
        n += 1;
    }
    n as isize
}
version!(_ibv_query_gid_table, "IBVERBS_1.11");

#[no_mangle]
pub unsafe extern "C" fn ibv_query_pkey(
    c: *mut sys::ibv_context,
    port: u8,
    index: c_int,
    pkey: *mut u16,
) -> c_int {
    // rdma-core reads the sysfs pkey file: -1 with errno when it cannot (ENOENT past the
    // table, which holds one entry: the default full-membership P_Key).
    if ctx_of(c).is_none() || port != 1 || pkey.is_null() {
        return neg1_errno(libc::EINVAL);
    }
    if index != 0 {
        return neg1_errno(libc::ENOENT);
    }
    *pkey = 0xffffu16.to_be();
    0
}
version!(ibv_query_pkey, "IBVERBS_1.1");

#[no_mangle]
pub unsafe extern "C" fn ibv_get_pkey_index(
    c: *mut sys::ibv_context,
    port: u8,
    pkey: u16,
) -> c_int {
    // As rdma-core: the index of the table entry equal to `pkey`, else -1 with errno (the
    // lookup past the table's end failed).
    if ctx_of(c).is_none() || port != 1 {
        return neg1_errno(libc::EINVAL);
    }
    if u16::from_be(pkey) == 0xffff {
        0
    } else {
        neg1_errno(libc::ENOENT)
    }
}
version!(ibv_get_pkey_index, "IBVERBS_1.5");
