//! Helpers shared by ferroce's cross-crate integration tests (in `tests/tests/`).

#![warn(missing_docs)]

use dataplane::config::RnicConfig;
use dataplane::runtime::Runtime;
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

/// The ACK timeout exponent of [`connect_pair`]: 2^10 x 4.096 us.
pub const ACK_TIMEOUT: u8 = 10;

/// Brings `me` to RTS towards `peer` (RC/UC) or to RTS (UD), with an ACK timeout of
/// 2^`timeout` x 4.096 us.
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

/// Brings the RC QP `qpn` of `ctx` through INIT and RTR to RTS towards QP `peer` at
/// `peer_gid` (MTU 1024, both directions starting at PSN `psn`, `rd_atomic` READs
/// outstanding each way, ACK timeout 14, seven retries of each kind).
pub fn rc_to_rts<V: Verbs>(
    ctx: &mut V,
    qpn: Qpn,
    peer: Qpn,
    peer_gid: Gid,
    psn: u32,
    rd_atomic: u8,
) {
    let init = QpAttr {
        state: Some(QpState::Init),
        pkey_index: Some(0),
        port: Some(1),
        access: Some(Access::ALL),
        ..Default::default()
    };
    ctx.modify_qp(qpn, &init).expect("INIT");
    let rtr = QpAttr {
        state: Some(QpState::Rtr),
        av: Some(AddressVector::new(peer_gid, 1)),
        path_mtu: Some(Mtu::M1024),
        dest_qp: Some(peer),
        rq_psn: Some(Psn::new(psn)),
        max_dest_rd_atomic: Some(rd_atomic),
        min_rnr_timer: Some(1),
        ..Default::default()
    };
    ctx.modify_qp(qpn, &rtr).expect("RTR");
    let rts = QpAttr {
        state: Some(QpState::Rts),
        sq_psn: Some(Psn::new(psn)),
        timeout: Some(14),
        retry_cnt: Some(7),
        rnr_retry: Some(7),
        max_rd_atomic: Some(rd_atomic),
        ..Default::default()
    };
    ctx.modify_qp(qpn, &rts).expect("RTS");
}

/// Connects `a` and `b` to each other with [`connect_with`] and an ACK timeout of
/// [`ACK_TIMEOUT`]: A sends from PSN `psn_a` and B from `psn_b`.
pub fn connect_pair<V: Verbs, W: Verbs>(
    a: &mut Side<V>,
    b: &mut Side<W>,
    mtu: Mtu,
    (psn_a, psn_b): (u32, u32),
    qp_type: QpType,
) {
    connect_pair_with(a, b, mtu, (psn_a, psn_b), qp_type, ACK_TIMEOUT);
}

/// [`connect_pair`] with an explicit ACK timeout exponent.
pub fn connect_pair_with<V: Verbs, W: Verbs>(
    a: &mut Side<V>,
    b: &mut Side<W>,
    mtu: Mtu,
    (psn_a, psn_b): (u32, u32),
    qp_type: QpType,
    timeout: u8,
) {
    let (qa, qb, ga, gb) = (a.qpn, b.qpn, a.gid, b.gid);
    connect_with(a, qb, gb, mtu, psn_a, psn_b, qp_type, timeout);
    connect_with(b, qa, ga, mtu, psn_b, psn_a, qp_type, timeout);
}

/// Two RNICs configured by `ca` and `cb` joined by an in-process ring pair (`name` names
/// the DPDK instance), with one [`side`] of `qp_type` and a `len`-byte buffer on each,
/// connected with [`connect_pair`] at `ca`'s path MTU.
pub fn loopback_pair(
    name: &str,
    (ca, cb): (RnicConfig, RnicConfig),
    qp_type: QpType,
    len: usize,
    psns: (u32, u32),
) -> (Runtime, Side, Side) {
    let mtu = ca.path_mtu;
    let rt = Runtime::loopback(name, ca, cb).expect("loopback");
    let mut a = side(rt.open(0).unwrap(), qp_type, len, 256);
    let mut b = side(rt.open(1).unwrap(), qp_type, len, 256);
    connect_pair(&mut a, &mut b, mtu, psns, qp_type);
    (rt, a, b)
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

/// Posts one signaled send WR `op` on `s`'s QP with one SGE: `len` bytes at `off` of `s`'s
/// registered buffer.
pub fn post_signaled<V: Verbs>(s: &mut Side<V>, wr_id: u64, op: WrOp, off: u64, len: u32) {
    post_signaled_to(s, wr_id, op, off, len, None);
}

/// [`post_signaled`] with a UD destination (`ud`: the address handle, QPN and Q_Key).
pub fn post_signaled_to<V: Verbs>(
    s: &mut Side<V>,
    wr_id: u64,
    op: WrOp,
    off: u64,
    len: u32,
    ud: Option<UdDest>,
) {
    let sge = s.mr.sge(off, len);
    s.ctx
        .post_send(
            s.qpn,
            &SendWr {
                wr_id,
                op,
                sg_list: &[sge],
                flags: SendFlags::SIGNALED,
                ud,
            },
        )
        .expect("post_send");
}

/// Posts a signaled WRITE of `len` bytes at `off` of A's buffer to the same offset of B's.
pub fn post_write_at<V: Verbs, W: Verbs>(
    a: &mut Side<V>,
    b: &Side<W>,
    wr_id: u64,
    off: u64,
    len: u32,
) {
    let op = WrOp::Write {
        remote_addr: b.mr.addr + off,
        rkey: b.mr.rkey.expect("B's MR has an rkey"),
    };
    post_signaled(a, wr_id, op, off, len);
}

/// Posts one receive WR on `s`'s QP into `len` bytes at `off` of `s`'s registered buffer.
pub fn post_recv_one<V: Verbs>(s: &mut Side<V>, wr_id: u64, off: u64, len: u32) {
    let sge = s.mr.sge(off, len);
    s.ctx
        .post_recv(
            s.qpn,
            &RecvWr {
                wr_id,
                sg_list: &[sge],
            },
        )
        .expect("post_recv");
}

/// Calls `f` every 2 ms until it returns true (then true) or `secs` passed (then false).
pub fn wait_until(secs: u64, mut f: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while std::time::Instant::now() < deadline {
        if f() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    false
}

/// Directories to remove when the test process exits.
static AT_EXIT: std::sync::Mutex<Vec<std::path::PathBuf>> = std::sync::Mutex::new(Vec::new());

extern "C" fn remove_at_exit() {
    let dirs = AT_EXIT.lock().map(|v| v.clone()).unwrap_or_default();
    for d in dirs {
        let _ = std::fs::remove_dir_all(d);
    }
}

/// Runs `cmd` to its end and returns its output, after checking that it ran and succeeded:
/// otherwise the test fails with `what` (say what to install when a tool may be missing),
/// the exit status and both streams.
pub fn output_ok(cmd: &mut std::process::Command, what: &str) -> std::process::Output {
    let o = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run {cmd:?}: {e}"));
    check_ok(&o, what);
    o
}

/// Fails the test with `what`, the exit status and both streams unless `o` is a success.
pub fn check_ok(o: &std::process::Output, what: &str) {
    assert!(
        o.status.success(),
        "{what}: {}\n{}{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
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

/// A's rdma_cm REQ to B's `port` (TCP port space), with rdma_cm's addressing header as
/// private data; returns A's connection ID.
pub fn cm_connect<V: ferroce_host::app::RdmaCm, W: Verbs>(
    a: &mut Side<V>,
    b: &Side<W>,
    port: u16,
) -> u32 {
    use roce::wire::cm::{service_id, CmaHeader, PS_TCP};
    let hdr = CmaHeader {
        src: std::net::SocketAddr::new(a.gid.to_ipv4().expect("IPv4 GID").into(), 40000),
        dst: b.gid.to_ipv4().expect("IPv4 GID").into(),
    };
    let params = roce::cm::ConnectParams {
        service_id: service_id(PS_TCP, port),
        local_gid: a.gid,
        remote_gid: b.gid,
        qpn: a.qpn.value(),
        starting_psn: 0x58642a,
        responder_resources: 16,
        initiator_depth: 16,
        path_mtu: 3,
        retry_count: 7,
        rnr_retry_count: 7,
        hop_limit: 64,
        private_data: hdr.private_data(&[]).expect("rdma_cm header"),
        ..Default::default()
    };
    a.ctx.cm_connect(params).expect("cm_connect")
}

/// `a` connects to `b` listening on `port` through rdma_cm: REQ, REP, RTU; both QPs to RTS
/// from what the messages carry. Returns both sides' connection IDs.
pub fn cm_establish<V: ferroce_host::app::RdmaCm, W: ferroce_host::app::RdmaCm>(
    a: &mut Side<V>,
    b: &mut Side<W>,
    port: u16,
) -> (u32, u32) {
    let a_id = cm_connect(a, b, port);
    let (b_id, path) = cm_accept_request(b, 0x5678, Some(16));
    let ferroce_host::abi::CmEventData::RepReceived {
        id, starting_psn, ..
    } = cm_event(a)
    else {
        panic!("not a REP");
    };
    assert_eq!(id, a_id);
    let path = ferroce_host::app::CmQpPath {
        peer_gid: b.gid,
        peer_qpn: b.qpn,
        rq_psn: 0x58642a,
        sq_psn: starting_psn,
        ..path
    };
    a.ctx.cm_bring_up(a.qpn, Access::ALL, &path).unwrap();
    a.ctx.cm_rtu(a_id).unwrap();
    assert_eq!(
        cm_event(a),
        ferroce_host::abi::CmEventData::Established { id: a_id }
    );
    assert_eq!(
        cm_event(b),
        ferroce_host::abi::CmEventData::Established { id: b_id }
    );
    (a_id, b_id)
}

/// The next rdma_cm event of `s` (within 10 s).
pub fn cm_event<V: ferroce_host::app::RdmaCm>(s: &mut Side<V>) -> ferroce_host::abi::CmEventData {
    s.ctx
        .cm_wait_event(std::time::Duration::from_secs(10))
        .expect("cm_wait_event")
        .expect("an rdma_cm event")
}

/// The test configuration of RNIC `host` (`dataplane::runtime::test_config`, path MTU 1024)
/// spread over `workers` worker threads (`worker.count`).
pub fn on_workers(host: u8, workers: u32) -> RnicConfig {
    let mut c = dataplane::runtime::test_config(host, 1024);
    c.worker_count = workers;
    c
}

/// The path an RC QP is brought up with through rdma_cm (`cm_bring_up`) towards QP
/// `peer_qpn` at `peer_gid`: source GID 1, MTU 1024, receiving from `rq_psn` and sending
/// from `sq_psn`, `max_rd_atomic` READ/ATOMICs outstanding, 16 accepted, perftest's retry
/// counts and timeout.
pub fn cm_path(
    peer_gid: Gid,
    peer_qpn: Qpn,
    (rq_psn, sq_psn): (u32, u32),
    max_rd_atomic: u8,
) -> ferroce_host::app::CmQpPath {
    ferroce_host::app::CmQpPath {
        peer_gid,
        sgid_index: 1,
        peer_qpn,
        path_mtu: Mtu::M1024,
        rq_psn,
        sq_psn,
        max_rd_atomic,
        max_dest_rd_atomic: 16,
        retry_cnt: 7,
        rnr_retry: 7,
        timeout: 14,
    }
}

/// B's answer to its newest rdma_cm event, which must be a connect request: B's QP to RTS
/// through `cm_bring_up` on the [`cm_path`] towards the requester (`rq_psn` `psn`, `sq_psn`
/// the REQ's starting PSN, `max_rd_atomic` READ/ATOMICs outstanding, or as many as the REQ's
/// responder resources with `None`); then the REP with starting PSN `psn`, 16 READ/ATOMICs
/// each way, RNR retries 7. Returns B's connection ID and the path.
pub fn cm_accept_request<V: ferroce_host::app::RdmaCm>(
    b: &mut Side<V>,
    psn: u32,
    max_rd_atomic: Option<u8>,
) -> (u32, ferroce_host::app::CmQpPath) {
    let ferroce_host::abi::CmEventData::ConnectRequest {
        id,
        peer,
        qpn,
        starting_psn,
        responder_resources,
        ..
    } = cm_event(b)
    else {
        panic!("not a connect request");
    };
    let max_rd_atomic = max_rd_atomic.unwrap_or(responder_resources);
    let path = cm_path(peer, qpn, (psn, starting_psn), max_rd_atomic);
    b.ctx.cm_bring_up(b.qpn, Access::ALL, &path).unwrap();
    let accept = roce::cm::AcceptParams {
        qpn: b.qpn.value(),
        starting_psn: psn,
        responder_resources: 16,
        initiator_depth: 16,
        rnr_retry_count: 7,
        ..Default::default()
    };
    b.ctx.cm_accept(id, accept).unwrap();
    (id, path)
}

/// A runtime with one RNIC on one end of a DPDK ring pair, and the other end's queues and
/// pool, driven by hand (a peer built frame by frame).
pub fn raw_pair(
    cfg: RnicConfig,
    name: &str,
) -> (
    Runtime,
    pmd_bindings::RxQueue,
    pmd_bindings::TxQueue,
    std::sync::Arc<pmd_bindings::Mempool>,
) {
    dataplane::runtime::init_eal("ferroce-tests", &cfg).unwrap();
    let pool = Runtime::pool(&cfg).unwrap();
    let (p_rnic, p_raw) =
        pmd_bindings::ring_pair(name, &Runtime::port_config(&cfg), pool.clone()).unwrap();
    let rt = Runtime::with_ports(vec![(cfg, p_rnic, pool.clone())]).unwrap();
    let rx = p_raw.rx_queue(0).unwrap();
    let tx = p_raw.tx_queue(0).unwrap();
    std::mem::forget(p_raw); // the queues keep the port alive
    (rt, rx, tx, pool)
}

/// The first frame `pred` accepts among those the raw end receives within `secs` seconds.
pub fn receive_until(
    rx: &mut pmd_bindings::RxQueue,
    secs: u64,
    mut pred: impl FnMut(&[u8]) -> bool,
) -> Option<Vec<u8>> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    let mut burst: Vec<pmd_bindings::Mbuf> = Vec::with_capacity(32);
    while std::time::Instant::now() < deadline {
        rx.rx_burst(&mut burst);
        for m in burst.drain(..) {
            let f = m.to_vec();
            if pred(&f) {
                return Some(f);
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    None
}
