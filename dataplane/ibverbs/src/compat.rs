//! Conversions libibverbs exports for other libraries: the kernel ABI's attribute structs
//! (librdmacm) and the static-rate encodings.

use super::*;

/// Runs `copy` from `*src` into `*dst`, unless either is NULL (then libibverbs' copy
/// functions do nothing).
unsafe fn copy<D, S>(dst: *mut D, src: *const S, copy: impl FnOnce(&mut D, &S)) {
    if let (Some(d), Some(s)) = (dst.as_mut(), src.as_ref()) {
        copy(d, s);
    }
}

pub(crate) fn ah_from_kern(dst: &mut sys::ibv_ah_attr, src: &sys::ib_uverbs_ah_attr) {
    dst.grh.dgid.raw = src.grh.dgid;
    dst.grh.flow_label = src.grh.flow_label;
    dst.grh.sgid_index = src.grh.sgid_index;
    dst.grh.hop_limit = src.grh.hop_limit;
    dst.grh.traffic_class = src.grh.traffic_class;
    dst.dlid = src.dlid;
    dst.sl = src.sl;
    dst.src_path_bits = src.src_path_bits;
    dst.static_rate = src.static_rate;
    dst.is_global = src.is_global;
    dst.port_num = src.port_num;
}

/// Copies a kernel (uverbs) address vector into an `ibv_ah_attr` (librdmacm's path to
/// ucma's answers; ferroce never produces these, but librdmacm links it).
#[no_mangle]
pub unsafe extern "C" fn ibv_copy_ah_attr_from_kern(
    dst: *mut sys::ibv_ah_attr,
    src: *const sys::ib_uverbs_ah_attr,
) {
    copy(dst, src, ah_from_kern);
}
version!(ibv_copy_ah_attr_from_kern, "IBVERBS_1.1");

/// Copies a kernel (uverbs) QP attribute block into an `ibv_qp_attr`.
#[no_mangle]
pub unsafe extern "C" fn ibv_copy_qp_attr_from_kern(
    dst: *mut sys::ibv_qp_attr,
    src: *const sys::ib_uverbs_qp_attr,
) {
    copy(dst, src, |d, s| {
        d.qp_state = s.qp_state;
        d.cur_qp_state = s.cur_qp_state;
        d.path_mtu = s.path_mtu;
        d.path_mig_state = s.path_mig_state;
        d.qkey = s.qkey;
        d.rq_psn = s.rq_psn;
        d.sq_psn = s.sq_psn;
        d.dest_qp_num = s.dest_qp_num;
        d.qp_access_flags = s.qp_access_flags;
        d.cap.max_send_wr = s.max_send_wr;
        d.cap.max_recv_wr = s.max_recv_wr;
        d.cap.max_send_sge = s.max_send_sge;
        d.cap.max_recv_sge = s.max_recv_sge;
        d.cap.max_inline_data = s.max_inline_data;
        ah_from_kern(&mut d.ah_attr, &s.ah_attr);
        ah_from_kern(&mut d.alt_ah_attr, &s.alt_ah_attr);
        d.pkey_index = s.pkey_index;
        d.alt_pkey_index = s.alt_pkey_index;
        d.en_sqd_async_notify = s.en_sqd_async_notify;
        d.sq_draining = s.sq_draining;
        d.max_rd_atomic = s.max_rd_atomic;
        d.max_dest_rd_atomic = s.max_dest_rd_atomic;
        d.min_rnr_timer = s.min_rnr_timer;
        d.port_num = s.port_num;
        d.timeout = s.timeout;
        d.retry_cnt = s.retry_cnt;
        d.rnr_retry = s.rnr_retry;
        d.alt_port_num = s.alt_port_num;
        d.alt_timeout = s.alt_timeout;
    })
}
version!(ibv_copy_qp_attr_from_kern, "IBVERBS_1.0");

/// The path record fields the kernel's and libibverbs' layouts share by name (the GIDs
/// differ: a union in one, bytes in the other); the booleans and the MTU change width.
macro_rules! path_rec_fields {
    ($d:ident, $s:ident, $bool:ty, $mtu:ty) => {
        $d.dlid = $s.dlid;
        $d.slid = $s.slid;
        $d.raw_traffic = $s.raw_traffic as $bool;
        $d.flow_label = $s.flow_label;
        $d.reversible = $s.reversible as $bool;
        $d.mtu = $s.mtu as $mtu;
        $d.pkey = $s.pkey;
        $d.hop_limit = $s.hop_limit;
        $d.traffic_class = $s.traffic_class;
        $d.numb_path = $s.numb_path;
        $d.sl = $s.sl;
        $d.mtu_selector = $s.mtu_selector;
        $d.rate_selector = $s.rate_selector;
        $d.rate = $s.rate;
        $d.packet_life_time_selector = $s.packet_life_time_selector;
        $d.packet_life_time = $s.packet_life_time;
        $d.preference = $s.preference;
    };
}

/// Copies a kernel path record (`ib_user_path_rec`) into an `ibv_sa_path_rec`.
#[no_mangle]
pub unsafe extern "C" fn ibv_copy_path_rec_from_kern(
    dst: *mut sys::ibv_sa_path_rec,
    src: *const sys::ib_user_path_rec,
) {
    copy(dst, src, |d, s| {
        d.dgid.raw = s.dgid;
        d.sgid.raw = s.sgid;
        path_rec_fields!(d, s, c_int, u8);
    })
}
version!(ibv_copy_path_rec_from_kern, "IBVERBS_1.0");

/// The reverse of [`ibv_copy_path_rec_from_kern`].
#[no_mangle]
pub unsafe extern "C" fn ibv_copy_path_rec_to_kern(
    dst: *mut sys::ib_user_path_rec,
    src: *const sys::ibv_sa_path_rec,
) {
    copy(dst, src, |d, s| {
        d.dgid = s.dgid.raw;
        d.sgid = s.sgid.raw;
        path_rec_fields!(d, s, u32, u32);
    })
}
version!(ibv_copy_path_rec_to_kern, "IBVERBS_1.0");

/// `enum ibv_rate` and the link rate in Mb/s (IBA 9.11.1 static rate encodings).
pub(crate) const RATES: [(c_uint, c_int); 23] = [
    (sys::IBV_RATE_2_5_GBPS, 2500),
    (sys::IBV_RATE_5_GBPS, 5000),
    (sys::IBV_RATE_10_GBPS, 10000),
    (sys::IBV_RATE_20_GBPS, 20000),
    (sys::IBV_RATE_30_GBPS, 30000),
    (sys::IBV_RATE_40_GBPS, 40000),
    (sys::IBV_RATE_60_GBPS, 60000),
    (sys::IBV_RATE_80_GBPS, 80000),
    (sys::IBV_RATE_120_GBPS, 120000),
    (sys::IBV_RATE_14_GBPS, 14062),
    (sys::IBV_RATE_56_GBPS, 56250),
    (sys::IBV_RATE_112_GBPS, 112500),
    (sys::IBV_RATE_168_GBPS, 168750),
    (sys::IBV_RATE_25_GBPS, 25781),
    (sys::IBV_RATE_100_GBPS, 103125),
    (sys::IBV_RATE_200_GBPS, 206250),
    (sys::IBV_RATE_300_GBPS, 309375),
    (sys::IBV_RATE_28_GBPS, 28125),
    (sys::IBV_RATE_50_GBPS, 53125),
    (sys::IBV_RATE_400_GBPS, 425000),
    (sys::IBV_RATE_600_GBPS, 637500),
    (sys::IBV_RATE_800_GBPS, 850000),
    (sys::IBV_RATE_1200_GBPS, 1275000),
];

/// Multiples of 2.5 Gb/s, for the rates that are such multiples.
pub(crate) const MULTS: [(c_uint, c_int); 9] = [
    (sys::IBV_RATE_2_5_GBPS, 1),
    (sys::IBV_RATE_5_GBPS, 2),
    (sys::IBV_RATE_10_GBPS, 4),
    (sys::IBV_RATE_20_GBPS, 8),
    (sys::IBV_RATE_30_GBPS, 12),
    (sys::IBV_RATE_40_GBPS, 16),
    (sys::IBV_RATE_60_GBPS, 24),
    (sys::IBV_RATE_80_GBPS, 32),
    (sys::IBV_RATE_120_GBPS, 48),
];

/// The number `table` gives `rate`, or -1 for a rate it does not list.
fn number_of(table: &[(c_uint, c_int)], rate: c_uint) -> c_int {
    table.iter().find(|r| r.0 == rate).map_or(-1, |r| r.1)
}

/// The rate `table` gives the number `n`, or `IBV_RATE_MAX` for a number it does not list.
fn rate_of(table: &[(c_uint, c_int)], n: c_int) -> c_uint {
    table
        .iter()
        .find(|r| r.1 == n)
        .map_or(sys::IBV_RATE_MAX, |r| r.0)
}

#[no_mangle]
pub extern "C" fn ibv_rate_to_mbps(rate: c_uint) -> c_int {
    number_of(&RATES, rate)
}
version!(ibv_rate_to_mbps, "IBVERBS_1.1");

#[no_mangle]
pub extern "C" fn mbps_to_ibv_rate(mbps: c_int) -> c_uint {
    rate_of(&RATES, mbps)
}
version!(mbps_to_ibv_rate, "IBVERBS_1.1");

#[no_mangle]
pub extern "C" fn ibv_rate_to_mult(rate: c_uint) -> c_int {
    number_of(&MULTS, rate)
}
version!(ibv_rate_to_mult, "IBVERBS_1.0");

#[no_mangle]
pub extern "C" fn mult_to_ibv_rate(mult: c_int) -> c_uint {
    rate_of(&MULTS, mult)
}
version!(mult_to_ibv_rate, "IBVERBS_1.0");
