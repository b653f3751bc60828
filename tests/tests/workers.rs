//! An RNIC spread over two worker threads (`worker.count = 2`): each client's objects live on
//! one worker, QP numbers are striped so a frame's destination QP names its worker, the port's
//! owner steers what it receives and sends what the other worker builds. Data between clients
//! on every pair of workers, of two RNICs and within one, arrives verified.

use dataplane::config::RnicConfig;
use dataplane::runtime::{test_config, Runtime};
use dataplane::Verbs;
use ferroce_tests::{
    connect_pair, post_recv_one, post_signaled, post_signaled_to, post_write_at, side, wait_cq,
    wait_until, Side,
};
use roce::engine::QpnStripe;
use roce::types::Qkey;
use roce::verbs::*;

const LEN: usize = 8192;

fn two_workers(host: u8) -> RnicConfig {
    let mut c = test_config(host, 1024);
    c.worker_count = 2;
    c
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
    let mut s: Vec<Side> = (0..2)
        .map(|_| side(rt.open(rnic).unwrap(), t, LEN, 16))
        .collect();
    s.sort_by_key(|s| QpnStripe::owner(s.qpn, 2));
    let owners: Vec<u32> = s.iter().map(|s| QpnStripe::owner(s.qpn, 2)).collect();
    assert_eq!(
        owners,
        [0, 1],
        "one client on each worker, named by its QPs' numbers"
    );
    s.try_into().ok().unwrap()
}

#[test]
fn clients_on_either_worker_exchange_verified_data() {
    let rt =
        Runtime::loopback("ferroce-workers", two_workers(47), two_workers(48)).expect("loopback");
    assert_eq!(rt.workers(), 2, "two worker threads");
    assert_eq!((rt.shards(0), rt.shards(1)), (2, 2));
    let mut seed = 3;
    // Every pair of workers, across the two RNICs.
    for i in 0..2 {
        for j in 0..2 {
            let mut x = one_per_worker(&rt, 0);
            let mut y = one_per_worker(&rt, 1);
            let (x, y) = (&mut x[i], &mut y[j]);
            connect_pair(x, y, Mtu::M1024, (100, 200), QpType::Rc);
            exchange(x, y, seed);
            exchange(y, x, seed + 1);
            seed += 2;
        }
    }
    // Within one RNIC, from one worker to the other (internal loopback between workers).
    let [mut x, mut y] = one_per_worker(&rt, 0);
    connect_pair(&mut x, &mut y, Mtu::M1024, (5, 9), QpType::Rc);
    exchange(&mut x, &mut y, 41);
    exchange(&mut y, &mut x, 43);
    drop((x, y));
    let s = rt.stats(0);
    assert!(
        s.nic.rx_steered > 0,
        "the port's owner steered frames: {s:?}"
    );
    assert!(s.nic.tx_forwarded > 0, "and sent the other worker's");
    assert_eq!(s.nic.rx_steer_dropped, 0);
    rt.stop();
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

/// The connection manager runs where QP1 is, on the port's owner: a client placed on the
/// other worker gets a clear error from its CM calls, and one on the first listens.
#[test]
fn the_connection_manager_is_the_first_workers() {
    use dataplane::app::RdmaCm;
    let rt =
        Runtime::loopback("ferroce-workers3", two_workers(51), two_workers(52)).expect("loopback");
    let mut first = rt.open(0).unwrap();
    let mut second = rt.open(0).unwrap();
    assert_eq!(first.cm_listen(0x1_0000_1234), Ok(()));
    match second.cm_listen(0x1_0000_1235) {
        Err(roce::engine::VerbsError::InvalidArgument(m)) => {
            assert!(m.contains("first worker"), "{m}")
        }
        r => panic!("a CM call on the second worker: {r:?}"),
    }
    drop((first, second));
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
    let rt =
        Runtime::loopback("ferroce-workers5", two_workers(55), two_workers(56)).expect("loopback");
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
    x.ctx.destroy_qp(x.qpn).unwrap();
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
    drop(x);
    drop(y);
    assert!(
        wait_until(10, || rt.stats(0).mbufs_in_use <= base),
        "mbufs in use: {} against {base} before",
        rt.stats(0).mbufs_in_use
    );
    rt.stop();
}
