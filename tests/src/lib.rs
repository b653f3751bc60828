//! Helpers shared by ferroce's cross-crate integration tests (in `tests/tests/`).

#![warn(missing_docs)]

use dataplane::{Buffer, Context, Mr, Verbs};
use roce::engine::{CqId, QpInit};
use roce::memory::PdId;
use roce::types::{Gid, Psn, Qkey, Qpn};
use roce::verbs::*;

/// One side of a connection made through the verbs API (an in-process [`Context`] by
/// default, or any other [`Verbs`] implementation such as rnicd's remote context).
pub struct Side<V: Verbs = Context> {
    /// The context.
    pub ctx: V,
    /// Protection domain.
    pub pd: PdId,
    /// Send and receive CQ.
    pub cq: CqId,
    /// QP.
    pub qpn: Qpn,
    /// Buffer.
    pub buf: Buffer,
    /// Its MR.
    pub mr: Mr,
    /// GID index used (1 = the IPv4-mapped GID).
    pub gid: Gid,
}

/// Creates PD, CQ, a QP of `qp_type`, and a `len`-byte registered buffer on `ctx`.
pub fn side<V: Verbs>(mut ctx: V, qp_type: QpType, len: usize, depth: u32) -> Side<V> {
    let pd = ctx.alloc_pd().expect("pd");
    let cq = ctx.create_cq(depth * 4).expect("cq");
    let qpn = ctx
        .create_qp(&QpInit {
            pd,
            qp_type,
            send_cq: cq,
            recv_cq: cq,
            srq: None,
            caps: QpCaps {
                max_send_wr: depth,
                max_recv_wr: depth,
                max_send_sge: 2,
                max_recv_sge: 2,
                max_inline_data: 64,
            },
            sq_sig_all: false,
        })
        .expect("qp");
    let buf = ctx.alloc_buffer(len).expect("buffer");
    let mr = ctx.reg_mr(pd, &buf, 0, len, Access::ALL).expect("mr");
    let gid = ctx.query_gid(1).expect("gid 1");
    Side {
        ctx,
        pd,
        cq,
        qpn,
        buf,
        mr,
        gid,
    }
}

/// Brings `me` to RTS towards `peer` (RC/UC) or to RTS (UD), with an ACK timeout of 2^10 x
/// 4.096 us.
pub fn connect<V: Verbs>(
    me: &mut Side<V>,
    peer_qpn: Qpn,
    peer_gid: Gid,
    mtu: Mtu,
    my_psn: u32,
    peer_psn: u32,
    qp_type: QpType,
) {
    connect_with(me, peer_qpn, peer_gid, mtu, my_psn, peer_psn, qp_type, 10);
}

/// [`connect`] with an explicit ACK timeout exponent.
#[allow(clippy::too_many_arguments)]
pub fn connect_with<V: Verbs>(
    me: &mut Side<V>,
    peer_qpn: Qpn,
    peer_gid: Gid,
    mtu: Mtu,
    my_psn: u32,
    peer_psn: u32,
    qp_type: QpType,
    timeout: u8,
) {
    let mut init = QpAttr {
        state: Some(QpState::Init),
        pkey_index: Some(0),
        port: Some(1),
        ..Default::default()
    };
    if qp_type == QpType::Ud {
        init.qkey = Some(Qkey(0x1111_1111));
    } else {
        init.access = Some(Access::ALL);
    }
    me.ctx.modify_qp(me.qpn, &init).expect("INIT");
    let rtr = match qp_type {
        QpType::Ud => QpAttr {
            state: Some(QpState::Rtr),
            ..Default::default()
        },
        _ => QpAttr {
            state: Some(QpState::Rtr),
            av: Some(AddressVector::new(peer_gid, 1)),
            path_mtu: Some(mtu),
            dest_qp: Some(peer_qpn),
            rq_psn: Some(Psn::new(peer_psn)),
            max_dest_rd_atomic: (qp_type == QpType::Rc).then_some(16),
            min_rnr_timer: (qp_type == QpType::Rc).then_some(1),
            ..Default::default()
        },
    };
    me.ctx.modify_qp(me.qpn, &rtr).expect("RTR");
    let rts = match qp_type {
        QpType::Rc => QpAttr {
            state: Some(QpState::Rts),
            sq_psn: Some(Psn::new(my_psn)),
            timeout: Some(timeout),
            retry_cnt: Some(7),
            rnr_retry: Some(7),
            max_rd_atomic: Some(16),
            ..Default::default()
        },
        _ => QpAttr {
            state: Some(QpState::Rts),
            sq_psn: Some(Psn::new(my_psn)),
            ..Default::default()
        },
    };
    me.ctx.modify_qp(me.qpn, &rts).expect("RTS");
}

/// Polls `cq` until `n` completions arrived or `secs` passed.
pub fn wait_cq<V: Verbs>(s: &mut Side<V>, n: usize, secs: u64) -> Vec<Completion> {
    let mut out = Vec::new();
    let mut buf = [Completion::default(); 32];
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while out.len() < n && std::time::Instant::now() < deadline {
        let k = s.ctx.poll_cq(s.cq, &mut buf).expect("poll");
        out.extend_from_slice(&buf[..k]);
        if k == 0 {
            std::thread::sleep(std::time::Duration::from_micros(50));
        }
    }
    out
}

/// Directories to remove when the test process exits.
static AT_EXIT: std::sync::Mutex<Vec<std::path::PathBuf>> = std::sync::Mutex::new(Vec::new());

extern "C" fn remove_at_exit() {
    let dirs = AT_EXIT.lock().map(|v| v.clone()).unwrap_or_default();
    for d in dirs {
        let _ = std::fs::remove_dir_all(d);
    }
}

/// `ferroce-NAME-PID` under the system temp dir, created on first use and removed when the
/// test process exits (libtest ends through exit(), passed or failed), for state several
/// tests of one process share.
pub fn process_temp_dir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("ferroce-{name}-{}", std::process::id()));
    let mut v = AT_EXIT.lock().unwrap_or_else(|p| p.into_inner());
    if !v.contains(&d) {
        if v.is_empty() {
            // SAFETY: registers a handler that only removes directories.
            unsafe { libc::atexit(remove_at_exit) };
        }
        v.push(d.clone());
    }
    std::fs::create_dir_all(&d).unwrap();
    d
}
