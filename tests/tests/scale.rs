//! Many queue pairs on one RNIC: thousands of connected QPs each moving verified data, the
//! QP table indexed by QPN at its default size (`roce.max_qp` = 16384), and the limit
//! enforced where a configuration sets a smaller one.

use dataplane::runtime::{test_config, Runtime};
use dataplane::{Context, Verbs};
use ferroce_tests::on_workers;
use roce::engine::{qp_queue_bytes, CqId, QpInit, VerbsError};
use roce::memory::PdId;
use roce::types::{Gid, Qpn};
use roce::verbs::*;

const CAPS: QpCaps = QpCaps {
    max_send_wr: 2,
    max_recv_wr: 1,
    max_send_sge: 1,
    max_recv_sge: 1,
    max_inline_data: 0,
};

fn create<V: Verbs>(ctx: &mut V, pd: PdId, cq: CqId) -> Result<Qpn, VerbsError> {
    ctx.create_qp(&QpInit {
        caps: CAPS,
        ..QpInit::rc(pd, cq)
    })
}

fn to_rts<V: Verbs>(ctx: &mut V, qpn: Qpn, peer: Qpn, peer_gid: Gid) {
    ferroce_tests::rc_to_rts(ctx, qpn, peer, peer_gid, 7, 1);
}

/// 8192 connected RC pairs between two RNICs (16384 QPs in all, the default table size of
/// each RNIC is 16384): every pair moves its own 64-byte WRITE, all posted before any
/// completes, and each lands where it should.
#[test]
fn thousands_of_qps_each_move_their_own_data() {
    let rt = Runtime::loopback(
        "ferroce-scale",
        test_config(41, 1024),
        test_config(42, 1024),
    )
    .expect("loopback");
    assert_eq!(rt.device_limits(0).max_qp, 16384, "the default table");
    pairs_move_their_own_data(rt.open(0).unwrap(), rt.open(1).unwrap(), 8192);
    rt.stop();
}

/// 4096 QPs on each of two RNICs spread over two workers (`worker.count`), 2048 pairs
/// between the clients on each worker, both client pairs at once from two threads: every
/// pair's WRITE lands where it should.
#[test]
fn thousands_of_qps_over_two_workers_each_move_their_own_data() {
    let rt = Runtime::loopback("ferroce-scale3", on_workers(45, 2), on_workers(46, 2))
        .expect("loopback");
    let pairs: Vec<_> = (0..2)
        .map(|_| (rt.open(0).unwrap(), rt.open(1).unwrap()))
        .collect();
    let threads: Vec<_> = pairs
        .into_iter()
        .map(|(a, b)| std::thread::spawn(move || pairs_move_their_own_data(a, b, 2048)))
        .collect();
    for t in threads {
        t.join().expect("a client pair");
    }
    // Both workers' QPs are counted, and go with their clients.
    assert!(
        ferroce_tests::wait_until(10, || rt.stats(0).objects.qps == 0),
        "QPs left: {}",
        rt.stats(0).objects.qps
    );
    rt.stop();
}

/// `n` connected RC pairs between clients `a` and `b`: every pair moves its own 64-byte
/// WRITE, all posted before any completes, and each lands where it should.
fn pairs_move_their_own_data(mut a: Context, mut b: Context, n: usize) {
    const LEN: usize = 64;
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ca, cb) = (a.create_cq(n as u32).unwrap(), b.create_cq(16).unwrap());
    let (buf_a, buf_b) = (
        a.alloc_buffer(n * LEN).unwrap(),
        b.alloc_buffer(n * LEN).unwrap(),
    );
    let mr_a = a.reg_mr(pa, &buf_a, 0, n * LEN, Access::ALL).unwrap();
    let mr_b = b.reg_mr(pb, &buf_b, 0, n * LEN, Access::ALL).unwrap();
    let (ga, gb) = (a.query_gid(1).unwrap(), b.query_gid(1).unwrap());
    let qa: Vec<Qpn> = (0..n).map(|_| create(&mut a, pa, ca).unwrap()).collect();
    let qb: Vec<Qpn> = (0..n).map(|_| create(&mut b, pb, cb).unwrap()).collect();
    let mut distinct = qa.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), n, "every QP has its own number");
    for i in 0..n {
        to_rts(&mut a, qa[i], qb[i], gb);
        to_rts(&mut b, qb[i], qa[i], ga);
    }
    // Each pair writes its own pattern into its own 64 bytes of b's buffer.
    for (i, &qpn) in qa.iter().enumerate() {
        let data: Vec<u8> = (0..LEN)
            .map(|k| (i * 7 + k) as u8 ^ (i >> 8) as u8)
            .collect();
        buf_a.write(i * LEN, &data);
        a.post_send(
            qpn,
            &SendWr {
                wr_id: i as u64,
                op: WrOp::Write {
                    remote_addr: mr_b.addr + (i * LEN) as u64,
                    rkey: mr_b.rkey.unwrap(),
                },
                sg_list: &[mr_a.sge((i * LEN) as u64, LEN as u32)],
                flags: SendFlags::SIGNALED,
                ud: None,
            },
        )
        .unwrap();
    }
    let mut seen = vec![false; n];
    let mut wc = [Completion::default(); 64];
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut got = 0;
    while got < n {
        assert!(
            std::time::Instant::now() < deadline,
            "{got} of {n} completions"
        );
        let n = a.poll_cq(ca, &mut wc).unwrap();
        for c in &wc[..n] {
            assert_eq!(c.status, WcStatus::Success, "{c:?}");
            assert!(!seen[c.wr_id as usize], "completed twice: {c:?}");
            seen[c.wr_id as usize] = true;
            assert_eq!(c.qp_num, qa[c.wr_id as usize], "on its own QP");
        }
        got += n;
    }
    let mut all = vec![0u8; n * LEN];
    buf_b.read(0, &mut all);
    for i in 0..n {
        let want: Vec<u8> = (0..LEN)
            .map(|k| (i * 7 + k) as u8 ^ (i >> 8) as u8)
            .collect();
        assert_eq!(&all[i * LEN..(i + 1) * LEN], &want[..], "pair {i}");
    }
    // What one of these QPs costs the RNIC: its state and queues.
    eprintln!(
        "{n} QP pairs moved their data; one QP with these queues holds {} bytes of engine memory",
        qp_queue_bytes(&CAPS, false)
    );
    drop((a, b));
}

/// `roce.max_qp` sizes the table: one QP past it is refused with a clear error, and a
/// destroyed QP makes room again.
#[test]
fn roce_max_qp_bounds_the_qp_table() {
    let mut cfg0 = test_config(43, 1024);
    let mut cfg1 = test_config(44, 1024);
    cfg0.max_qp = 8;
    cfg1.max_qp = 8;
    let rt = Runtime::loopback("ferroce-scale2", cfg0, cfg1).expect("loopback");
    assert_eq!(rt.device_limits(0).max_qp, 8);
    let mut a = rt.open(0).unwrap();
    let pd = a.alloc_pd().unwrap();
    let cq = a.create_cq(16).unwrap();
    let qps: Vec<Qpn> = (0..8).map(|_| create(&mut a, pd, cq).unwrap()).collect();
    assert_eq!(
        create(&mut a, pd, cq),
        Err(VerbsError::NoResources("queue pairs"))
    );
    a.destroy_qp(qps[3]).unwrap();
    let again = create(&mut a, pd, cq).unwrap();
    assert!(
        !qps.contains(&again),
        "a new number, not the destroyed QP's"
    );
    drop(a);
    rt.stop();
}
