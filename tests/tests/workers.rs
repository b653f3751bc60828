//! An RNIC spread over two worker threads (`worker.count = 2`): each client's objects live on
//! one worker, QP numbers are striped so a frame's destination QP names its worker, the port's
//! owner steers what it receives and sends what the other worker builds. Data between clients
//! on every pair of workers, of two RNICs and within one, arrives verified; rdma_cm works
//! for clients on any worker.

use dataplane::config::RnicConfig;
use dataplane::runtime::Runtime;
use dataplane::Verbs;
use ferroce_host::abi::CmEventData;
use ferroce_host::app::RdmaCm;
use ferroce_tests::{
    cm_establish, cm_event, connect_pair, on_workers, post_recv_one, post_signaled,
    post_signaled_to, post_write_at, side, wait_cq, wait_until, Side,
};
use roce::engine::QpnStripe;
use roce::types::Qkey;
use roce::verbs::*;
use roce::wire::cm::{service_id, PS_TCP};

const LEN: usize = 8192;

fn two_workers(host: u8) -> RnicConfig {
    on_workers(host, 2)
}

/// A WRITE, a SEND and a READ of 3000 bytes (three packets each at MTU 1024) from `a` to
/// `b`, each checked byte for byte.
fn exchange(a: &mut Side, b: &mut Side, seed: u8) {
    let data: Vec<u8> = (0..3000)
        .map(|i| (i as u8).wrapping_mul(seed) ^ seed)
        .collect();
    a.buf.write(0, &data);
    // WRITE a[0..3000] -> b[0..3000].
    let op = WrOp::Write {
        remote_addr: b.mr.addr,
        rkey: b.mr.rkey.unwrap(),
    };
    post_signaled(a, 1, op, 0, 3000);
    let wc = wait_cq(a, 1, 20);
    assert_eq!(wc.len(), 1, "the WRITE completes");
    assert_eq!(wc[0].status, WcStatus::Success, "{:?}", wc[0]);
    let mut got = vec![0u8; 3000];
    b.buf.read(0, &mut got);
    assert_eq!(got, data, "the WRITE's data");
    // SEND a[0..3000] -> b[4096..].
    post_recv_one(b, 2, 4096, 4096);
    post_signaled(a, 3, WrOp::Send, 0, 3000);
    let wa = wait_cq(a, 1, 20);
    let wb = wait_cq(b, 1, 20);
    assert_eq!(wa.first().map(|c| c.status), Some(WcStatus::Success));
    assert_eq!(
        wb.first().map(|c| (c.status, c.byte_len)),
        Some((WcStatus::Success, 3000))
    );
    b.buf.read(4096, &mut got);
    assert_eq!(got, data, "the SEND's data");
    // READ b[0..3000] -> a[4096..].
    let op = WrOp::Read {
        remote_addr: b.mr.addr,
        rkey: b.mr.rkey.unwrap(),
    };
    post_signaled(a, 4, op, 4096, 3000);
    let wc = wait_cq(a, 1, 20);
    assert_eq!(
        wc.first().map(|c| c.status),
        Some(WcStatus::Success),
        "{wc:?}"
    );
    a.buf.read(4096, &mut got);
    assert_eq!(got, data, "the READ's data");
}

/// Two clients of RNIC `rnic`, one on each worker (clients are placed in turn), ordered by
/// worker: each with an RC QP, a CQ and a registered buffer.
fn one_per_worker(rt: &Runtime, rnic: usize) -> [Side; 2] {
    one_per_worker_of(rt, rnic, QpType::Rc)
}

/// [`one_per_worker`] with QPs of type `t`.
fn one_per_worker_of(rt: &Runtime, rnic: usize, t: QpType) -> [Side; 2] {
    clients_by_worker(rt, rnic, 2, t).try_into().ok().unwrap()
}

/// `n` clients of RNIC `rnic` (spread over `n` workers), one on each worker, ordered by
/// worker: each with a QP of type `t`, a CQ and a registered buffer.
fn clients_by_worker(rt: &Runtime, rnic: usize, n: u32, t: QpType) -> Vec<Side> {
    let mut s: Vec<Side> = (0..n)
        .map(|_| side(rt.open(rnic).unwrap(), t, LEN, 16))
        .collect();
    s.sort_by_key(|s| QpnStripe::owner(s.qpn, n));
    let owners: Vec<u32> = s.iter().map(|s| QpnStripe::owner(s.qpn, n)).collect();
    assert_eq!(
        owners,
        (0..n).collect::<Vec<_>>(),
        "one client on each worker, named by its QPs' numbers"
    );
    s
}

/// Clients on every pair of workers across the two RNICs, and on the two workers of RNIC 0,
/// exchange verified data (`exchange` both ways).
fn exchange_everywhere(rt: &Runtime) {
    assert_eq!(rt.workers(), 2, "two worker threads");
    assert_eq!((rt.shards(0), rt.shards(1)), (2, 2));
    let mut seed = 3;
    for i in 0..2 {
        for j in 0..2 {
            let mut x = one_per_worker(rt, 0);
            let mut y = one_per_worker(rt, 1);
            let (x, y) = (&mut x[i], &mut y[j]);
            connect_pair(x, y, Mtu::M1024, (100, 200), QpType::Rc);
            exchange(x, y, seed);
            exchange(y, x, seed + 1);
            seed += 2;
        }
    }
    // Within one RNIC, from one worker to the other (internal loopback between workers).
    let [mut x, mut y] = one_per_worker(rt, 0);
    connect_pair(&mut x, &mut y, Mtu::M1024, (5, 9), QpType::Rc);
    exchange(&mut x, &mut y, 41);
    exchange(&mut y, &mut x, 43);
}

/// With a queue pair per worker on the ring link, each worker receives and sends on its own
/// queue: frames that arrive at the worker not owning their QP are steered, none forwarded.
#[test]
fn clients_on_either_worker_exchange_verified_data() {
    let rt =
        Runtime::loopback("ferroce-workers", two_workers(47), two_workers(48)).expect("loopback");
    exchange_everywhere(&rt);
    let s = rt.stats(0);
    assert!(s.nic.rx_steered > 0, "frames were steered: {s:?}");
    assert_eq!(s.nic.tx_forwarded, 0, "every worker sent on its own queue");
    assert_eq!(s.nic.rx_steer_dropped, 0);
    rt.stop();
}

/// Four workers per RNIC (four threads on this machine's two cores, idle ones asleep):
/// clients on every worker exchange verified data with a client on another worker of the
/// other RNIC and of their own.
#[test]
fn four_workers_exchange_verified_data() {
    let rt = Runtime::loopback("ferroce-workers8", on_workers(61, 4), on_workers(62, 4))
        .expect("loopback");
    assert_eq!((rt.workers(), rt.shards(0), rt.shards(1)), (4, 4, 4));
    let mut x = clients_by_worker(&rt, 0, 4, QpType::Rc);
    let mut y = clients_by_worker(&rt, 1, 4, QpType::Rc);
    let mut seed = 5;
    // Worker i of RNIC 0 with worker 3 - i of RNIC 1.
    for (a, b) in x.iter_mut().zip(y.iter_mut().rev()) {
        connect_pair(a, b, Mtu::M1024, (100, 200), QpType::Rc);
        exchange(a, b, seed);
        exchange(b, a, seed + 1);
        seed += 2;
    }
    // Within RNIC 0: workers 0 and 3, 1 and 2.
    let mut z = clients_by_worker(&rt, 0, 4, QpType::Rc);
    let (lo, hi) = z.split_at_mut(2);
    for (a, b) in lo.iter_mut().zip(hi.iter_mut().rev()) {
        connect_pair(a, b, Mtu::M1024, (7, 11), QpType::Rc);
        exchange(a, b, seed);
        exchange(b, a, seed + 1);
        seed += 2;
    }
    for i in 0..2 {
        let s = rt.stats(i);
        assert!(s.nic.rx_steered > 0, "RNIC {i} steered: {s:?}");
        assert_eq!(s.nic.rx_steer_dropped, 0);
    }
    drop((x, y, z));
    rt.stop();
}

/// With a capture the port has one queue pair, which the first worker serves for both: it
/// steers what it receives, sends what the second builds, and the capture holds the frames
/// of both workers' QPs.
#[test]
fn with_a_capture_the_first_worker_carries_the_others_frames() {
    let dir = ferroce_tests::process_temp_dir("workers-pcap");
    let pcap = dir.join("a.pcap");
    let mut a = two_workers(57);
    a.pcap = Some(pcap.clone());
    assert_eq!(a.port_queues(), 1);
    let rt = Runtime::loopback("ferroce-workers6", a, two_workers(58)).expect("loopback");
    exchange_everywhere(&rt);
    let s = rt.stats(0);
    assert!(s.nic.rx_steered > 0, "the first worker steered: {s:?}");
    assert!(
        s.nic.tx_forwarded > 0,
        "and sent the second worker's frames"
    );
    assert_eq!(s.nic.rx_steer_dropped, 0);
    rt.stop();
    let data = std::fs::read(&pcap).unwrap();
    let mut by_worker = [0usize; 2];
    for r in roce::pcap::Reader::new(&data).unwrap() {
        let r = r.unwrap();
        if let Some(q) = roce::wire::frame::dest_qpn(r.data) {
            by_worker[QpnStripe::owner(q, 2) as usize] += 1;
        }
    }
    assert!(
        by_worker[0] > 0 && by_worker[1] > 0,
        "frames to QPs of both workers captured: {by_worker:?}"
    );
}

/// Each worker holds its stripe of `roce.max_qp`: with 8 QPs over two workers, a client's
/// worker takes 4 and refuses the fifth with a clear error.
#[test]
fn each_worker_holds_its_share_of_the_qp_table() {
    let (mut c0, mut c1) = (two_workers(49), two_workers(50));
    c0.max_qp = 8;
    c1.max_qp = 8;
    let rt = Runtime::loopback("ferroce-workers2", c0, c1).expect("loopback");
    let mut ctx = rt.open(0).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16).unwrap();
    let qps: Vec<_> = (0..4)
        .map(|_| ctx.create_qp(&roce::engine::QpInit::rc(pd, cq)).unwrap())
        .collect();
    assert!(qps.iter().all(|&q| QpnStripe::owner(q, 2) == 0), "{qps:?}");
    assert_eq!(
        ctx.create_qp(&roce::engine::QpInit::rc(pd, cq)),
        Err(roce::engine::VerbsError::NoResources("queue pairs"))
    );
    drop(ctx);
    rt.stop();
}

/// rdma_cm on every worker: the port's owner steers a REQ to the worker listening to its
/// service and every other CM message to the worker whose agent handed out the ID it names.
/// Clients on either worker of one RNIC connect to listeners on either worker of the other,
/// move verified data, and disconnect; a service is listened to once per RNIC.
#[test]
fn rdma_cm_connects_clients_on_any_worker() {
    let rt =
        Runtime::loopback("ferroce-workers3", two_workers(51), two_workers(52)).expect("loopback");
    let mut port = 7000;
    for (i, j) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
        let mut xs = one_per_worker(&rt, 0);
        let mut ys = one_per_worker(&rt, 1);
        port += 1;
        let sid = service_id(PS_TCP, port);
        ys[j].ctx.cm_listen(sid).unwrap();
        // The other worker's client cannot listen to it too: one listener per RNIC.
        assert!(ys[1 - j].ctx.cm_listen(sid).is_err(), "listened twice");
        let (x, y) = (&mut xs[i], &mut ys[j]);
        let (x_id, y_id) = cm_establish(x, y, port);
        exchange(x, y, port as u8);
        x.ctx.cm_disconnect(x_id).unwrap();
        assert_eq!(cm_event(x), CmEventData::Disconnected { id: x_id });
        assert_eq!(cm_event(y), CmEventData::Disconnected { id: y_id });
    }
    rt.stop();
}

/// UD datagrams are steered by their destination QP too: between clients on every pair of
/// workers of two RNICs, and between the two workers of one, each arrives with its data,
/// length, immediate and source QP.
#[test]
fn ud_datagrams_reach_the_worker_of_their_qp() {
    let rt =
        Runtime::loopback("ferroce-workers4", two_workers(53), two_workers(54)).expect("loopback");
    let mut x = one_per_worker_of(&rt, 0, QpType::Ud);
    let mut y = one_per_worker_of(&rt, 1, QpType::Ud);
    for s in x.iter_mut().chain(y.iter_mut()) {
        let (q, g) = (s.qpn, s.gid);
        ferroce_tests::connect_with(s, q, g, Mtu::M1024, 1, 1, QpType::Ud, 10);
    }
    let mut imm = 0;
    // Every worker of RNIC 0 to every worker of RNIC 1 and back.
    for a in &mut x {
        for b in &mut y {
            datagram(a, b, &mut imm);
            datagram(b, a, &mut imm);
        }
    }
    // Between the two workers of RNIC 0.
    let [x0, x1] = &mut x;
    datagram(x0, x1, &mut imm);
    datagram(x1, x0, &mut imm);
    drop((x, y));
    rt.stop();
}

/// One 1000-byte UD SEND with immediate from `a` to `b`, checked on arrival.
fn datagram(a: &mut Side, b: &mut Side, imm: &mut u32) {
    *imm += 1;
    let data: Vec<u8> = (0..1000).map(|i| (i as u32 ^ *imm) as u8).collect();
    a.buf.write(0, &data);
    post_recv_one(b, 7, 0, 2048);
    let dest = UdDest {
        ah: AddressVector::new(b.gid, 1),
        remote_qpn: b.qpn,
        remote_qkey: Qkey(0x1111_1111),
    };
    post_signaled_to(a, 8, WrOp::SendWithImm { imm: *imm }, 0, 1000, Some(dest));
    let wa = wait_cq(a, 1, 20);
    assert_eq!(
        wa.first().map(|c| c.status),
        Some(WcStatus::Success),
        "{wa:?}"
    );
    let wb = wait_cq(b, 1, 20);
    let c = wb.first().expect("the datagram arrives");
    assert_eq!(c.status, WcStatus::Success, "{c:?}");
    // A UD receive buffer starts with the 40-byte GRH.
    assert_eq!(
        (c.byte_len, c.imm_data, c.src_qp),
        (1040, *imm, a.qpn),
        "{c:?}"
    );
    let mut got = vec![0u8; 1000];
    b.buf.read(40, &mut got);
    assert_eq!(got, data);
}

/// A QP destroyed, and then its client closed, while its peer's WRITEs stream to it through
/// the steering queue: the peer's WRITEs end (in error once the QP is gone), and every mbuf
/// comes back to the pool.
#[test]
fn a_qp_destroyed_while_its_frames_are_steered_leaks_nothing() {
    gone_while_steered("ferroce-workers5", (55, 56), true);
}

/// A client that goes without destroying anything (closed, as rnicd closes a client whose
/// process was killed) while its peer's WRITEs are steered to its QP: the same outcome.
#[test]
fn a_client_gone_while_its_frames_are_steered_leaks_nothing() {
    gone_while_steered("ferroce-workers9", (63, 64), false);
}

/// The receiving client on RNIC 0's second worker goes while 16 WRITEs of 8 KiB stream to it
/// (its QP destroyed first if `destroy`, else with its client): every WRITE ends, and the
/// pool's mbufs in use come back to where they were before.
fn gone_while_steered(prefix: &str, (ha, hb): (u8, u8), destroy: bool) {
    let rt = Runtime::loopback(prefix, two_workers(ha), two_workers(hb)).expect("loopback");
    // Mbufs in use with the workers idle: what the pool must come back to.
    std::thread::sleep(std::time::Duration::from_millis(50));
    let base = rt.stats(0).mbufs_in_use;
    let [_x0, mut x] = one_per_worker(&rt, 0);
    let [mut y, _y1] = one_per_worker(&rt, 1);
    connect_pair(&mut y, &mut x, Mtu::M1024, (1, 2), QpType::Rc);
    // 16 WRITEs of 8 KiB (8 packets each) in flight to x, on RNIC 0's second worker.
    for i in 0..16 {
        post_write_at(&mut y, &x, i, 0, LEN as u32);
    }
    // Gone while the WRITEs are under way: their frames are then dropped by the engine of
    // the worker they were steered to, which knows no such QP.
    let mut closed_later = None;
    if destroy {
        x.ctx.destroy_qp(x.qpn).unwrap();
        closed_later = Some(x);
    } else {
        drop(x);
    }
    // Each WRITE ends: done before the QP went, or in error once x's RNIC stops answering
    // (the first to exhaust its retries, the rest flushed).
    let done = wait_cq(&mut y, 16, 30);
    assert_eq!(done.len(), 16, "every WRITE ends: {done:?}");
    for c in &done {
        assert!(
            matches!(
                c.status,
                WcStatus::Success | WcStatus::RetryExcErr | WcStatus::WrFlushErr
            ),
            "{c:?}"
        );
    }
    drop(closed_later);
    drop(y);
    assert!(
        wait_until(10, || rt.stats(0).mbufs_in_use <= base),
        "mbufs in use: {} against {base} before",
        rt.stats(0).mbufs_in_use
    );
    rt.stop();
}

/// CNPs are steered like the rest: A's port marks its data CE (`fault.ce`, which keeps the
/// link to one queue pair, so the first worker of each RNIC steers), B's QP on its second
/// worker answers with CNPs, and they reach A's QP on its second worker, whose rate drops.
#[test]
fn cnps_reach_the_worker_of_their_qp() {
    let mut ca = two_workers(59);
    ca.ecn = true;
    ca.fault.ce = 1.0;
    ca.dcqcn.rp = Some(dcb::dcqcn::RpParams::paper(10_000.0));
    let mut cb = two_workers(60);
    cb.ecn = true;
    cb.dcqcn.np_min_interval_ns = Some(50_000);
    let rt = Runtime::loopback("ferroce-workers7", ca, cb).expect("loopback");
    let [_x0, mut x] = one_per_worker(&rt, 0);
    let [_y0, mut y] = one_per_worker(&rt, 1);
    connect_pair(&mut x, &mut y, Mtu::M1024, (1, 2), QpType::Rc);
    // The lowest rate seen after each WRITE: on a loaded machine the time between a CNP
    // and a later look can be long enough for the rate to climb back to line rate.
    let mut rate: Option<u64> = None;
    for i in 0..8 {
        post_write_at(&mut x, &y, i, 0, LEN as u32);
        let c = wait_cq(&mut x, 1, 20);
        assert!(c.len() == 1 && c[0].status == WcStatus::Success, "{c:?}");
        if let Some(k) = x.ctx.query_qp(x.qpn).unwrap().rate_kbps {
            rate = Some(rate.map_or(k, |r| r.min(k)));
        }
    }
    drop((x, y));
    let snaps = rt.stop();
    let (sa, sb) = (&snaps[0], &snaps[1]);
    assert!(sb.qps.np_cnp_sent > 0, "B sent CNPs: {:?}", sb.qps);
    assert!(sa.qps.rp_cnp_handled > 0, "A's QP took them: {:?}", sa.qps);
    assert!(sa.nic.rx_steered > 0 && sb.nic.rx_steered > 0);
    assert!(
        rate.is_some_and(|k| k < 10_000_000),
        "A's QP runs below line rate: {rate:?} kb/s"
    );
}
