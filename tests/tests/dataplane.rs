//! The dataplane on DPDK: UC and UD between two RNICs, recovery over a fault-injecting link,
//! ARP/ping/ND answered on a port, and a net_pcap replay of rxe's requests whose responses
//! must equal rxe's.

use std::path::Path;
use std::time::{Duration, Instant};

use dataplane::config::RnicConfig;
use dataplane::nic::Nic;
use dataplane::runtime::{test_config, Runtime};
use dataplane::Verbs;
use ferroce_tests::{
    connect_pair_with, connect_with, loopback_pair, post_recv_one, post_signaled, post_signaled_to,
    post_write_at, raw_pair, receive_until, side, wait_cq, wait_until, Side, ACK_TIMEOUT,
};
use pmd_bindings::{Mbuf, Port};
use roce::types::{Gid, Psn, Qkey, Qpn};
use roce::verbs::*;
use roce::wire::frame::{self, FrameKind};

fn pair_with(ca: RnicConfig, cb: RnicConfig, t: QpType) -> (Runtime, Side, Side) {
    loopback_pair("ferroce-tests", (ca, cb), t, 8 << 20, (0x00ff_fff0, 0x77))
}

fn pattern(seed: u32, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32 ^ seed).wrapping_mul(0x9e37_79b1).rotate_left(7) as u8)
        .collect()
}

#[test]
fn uc_and_ud_between_two_rnics() {
    // UC: SEND and WRITE with immediate.
    let (rt, mut a, mut b) = pair_with(test_config(3, 1024), test_config(4, 1024), QpType::Uc);
    let data = pattern(1, 10_000);
    a.buf.write(0, &data);
    post_recv_one(&mut b, 1, 0, 16384);
    b.ctx
        .post_recv(
            b.qpn,
            &RecvWr {
                wr_id: 2,
                sg_list: &[],
            },
        )
        .unwrap();
    post_signaled(&mut a, 1, WrOp::Send, 0, 10_000);
    post_signaled(
        &mut a,
        2,
        WrOp::WriteWithImm {
            remote_addr: b.mr.addr + 65536,
            rkey: b.mr.rkey.unwrap(),
            imm: 9,
        },
        0,
        3000,
    );
    assert!(wait_cq(&mut a, 2, 10)
        .iter()
        .all(|c| c.status == WcStatus::Success));
    let r = wait_cq(&mut b, 2, 10);
    assert_eq!(
        r.iter().map(|c| (c.wr_id, c.byte_len)).collect::<Vec<_>>(),
        vec![(1, 10_000), (2, 3000)]
    );
    assert_eq!(b.buf.to_vec(0, 10_000), data);
    assert_eq!(b.buf.to_vec(65536, 3000), data[..3000]);
    drop((a, b));
    drop(rt);

    // UD: SEND with immediate to the peer's QP through an address handle.
    let (rt, mut a, mut b) = pair_with(test_config(3, 1024), test_config(4, 1024), QpType::Ud);
    post_recv_one(&mut b, 5, 0, 2048);
    a.buf.write(0, &data[..1024]);
    let ud = UdDest {
        ah: AddressVector::new(b.gid, 1),
        remote_qpn: b.qpn,
        remote_qkey: Qkey(0x1111_1111),
    };
    a.ctx
        .post_send(
            a.qpn,
            &SendWr {
                wr_id: 1,
                op: WrOp::SendWithImm { imm: 3 },
                sg_list: &[a.mr.sge(0, 1024)],
                flags: SendFlags::SIGNALED,
                ud: Some(ud),
            },
        )
        .unwrap();
    assert_eq!(wait_cq(&mut a, 1, 10)[0].status, WcStatus::Success);
    let c = wait_cq(&mut b, 1, 10)[0];
    assert_eq!(
        (c.status, c.byte_len, c.src_qp, c.imm_data),
        (WcStatus::Success, 1064, a.qpn, 3)
    );
    assert!(c.wc_flags.contains(WcFlags::GRH));
    assert_eq!(b.buf.to_vec(40, 1024), data[..1024]);
    assert_eq!(
        &b.buf.to_vec(32, 8),
        &[10, 99, 0, 3, 10, 99, 0, 4],
        "GRH: the IPv4 addresses"
    );
    drop(rt);
}

/// WRITEs of sizes from 1 B to 300 KB, then SENDs and READs back, from `a` to `b`: every
/// one completes successfully and every byte arrives as written (`seed` varies the data).
fn mixed_traffic_arrives(a: &mut Side, b: &mut Side, seed: u32) {
    let sizes = [1usize, 1000, 4096, 20_000, 100_000, 300_000];
    let mut off = 0u64;
    for (i, &len) in sizes.iter().enumerate() {
        a.buf.write(off as usize, &pattern(seed + i as u32, len));
        post_write_at(a, b, i as u64, off, len as u32);
        off += len as u64;
    }
    for i in 0..4u64 {
        post_recv_one(b, i, (4 << 20) + i * 65536, 65536);
        post_signaled(a, 100 + i, WrOp::Send, i * 1000, 30_000);
        post_signaled(
            a,
            200 + i,
            WrOp::Read {
                remote_addr: b.mr.addr,
                rkey: b.mr.rkey.unwrap(),
            },
            (6 << 20) + i * 65536,
            50_000,
        );
    }
    let c = wait_cq(a, sizes.len() + 8, 60);
    assert_eq!(c.len(), sizes.len() + 8, "{c:?}");
    assert!(c.iter().all(|c| c.status == WcStatus::Success), "{c:?}");
    let mut off = 0;
    for (i, &len) in sizes.iter().enumerate() {
        assert_eq!(b.buf.to_vec(off, len), pattern(seed + i as u32, len));
        off += len;
    }
    for i in 0..4usize {
        assert_eq!(
            a.buf.to_vec((6 << 20) + i * 65536, 50_000),
            b.buf.to_vec(0, 50_000)
        );
        assert_eq!(
            b.buf.to_vec((4 << 20) + i * 65536, 30_000),
            a.buf.to_vec(i * 1000, 30_000)
        );
    }
    let r = wait_cq(b, 4, 10);
    assert!(r
        .iter()
        .all(|c| c.status == WcStatus::Success && c.byte_len == 30_000));
}

#[test]
fn rc_recovers_over_a_faulty_link() {
    let faulty = |h: u8| {
        let mut c = test_config(h, 1024);
        c.fault.loss = 0.02;
        c.fault.duplicate = 0.01;
        c.fault.corrupt = 0.01;
        c.fault.reorder = 0.01;
        c.fault.seed = h as u64;
        c
    };
    let (rt, mut a, mut b) = pair_with(faulty(3), faulty(4), QpType::Rc);
    mixed_traffic_arrives(&mut a, &mut b, 0);
    let snaps = rt.stop();
    let faults = snaps[0].nic.fault_lost + snaps[0].nic.fault_corrupted + snaps[1].nic.fault_lost;
    assert!(faults > 0, "faults were injected");
    assert!(
        snaps[0].qps.retransmitted_pkts > 0,
        "the requester retransmitted: {:?}",
        snaps[0].qps
    );
    assert!(
        snaps[0].dev.rx_icrc_encapsulated + snaps[1].dev.rx_icrc_encapsulated > 0,
        "corruption caught by the ICRC"
    );
    assert!(snaps[1].qps.duplicate_request + snaps[1].qps.out_of_sequence > 0);
}

/// A frame the fault injector holds back for reordering leaves on its own when no other
/// frame overtakes it (`fault::REORDER_HOLD_NS`): with every frame a candidate, a WRITE and
/// its ACK each get held on a link that then goes quiet, and yet the WRITE completes and
/// both RNICs come back to the mbufs they held when idle (a held frame used to stay until
/// the next one, for good on an idle link: the soak's "mbufs in use 2 at the end").
#[test]
fn a_frame_held_for_reordering_leaves_when_the_link_goes_quiet() {
    let reordering = |h: u8| {
        let mut c = test_config(h, 1024);
        c.fault.reorder = 1.0;
        c.fault.seed = h as u64;
        c
    };
    let (rt, mut a, b) = pair_with(reordering(9), reordering(10), QpType::Rc);
    // Every other frame is held (one at a time), so after some WRITEs, whichever way the
    // count of frames falls, a frame is held when the link goes quiet.
    std::thread::sleep(std::time::Duration::from_millis(50));
    let idle = [rt.stats(0).mbufs_in_use, rt.stats(1).mbufs_in_use];
    for i in 0..6u32 {
        let data = pattern(i, 3000);
        a.buf.write(0, &data);
        post_signaled(
            &mut a,
            i as u64,
            WrOp::Write {
                remote_addr: b.mr.addr,
                rkey: b.mr.rkey.unwrap(),
            },
            0,
            3000,
        );
        let c = wait_cq(&mut a, 1, 10);
        assert_eq!(c[0].status, WcStatus::Success, "{c:?}");
        assert_eq!(b.buf.to_vec(0, 3000), data);
        let mut last = None;
        let settled = ferroce_tests::wait_until(5, || {
            let now = [rt.stats(0).mbufs_in_use, rt.stats(1).mbufs_in_use];
            last = Some(now);
            now == idle
        });
        assert!(
            settled,
            "WRITE {i}: mbufs in use {last:?}, {idle:?} when idle"
        );
    }
    let snaps = rt.stop();
    assert!(snaps[0].nic.fault_reordered > 0 && snaps[1].nic.fault_reordered > 0);
}

/// Two RNICs, each on a worker thread of its own (`worker.thread`), over a lossy link:
/// WRITEs, READs and SENDs of every size complete with the right data (timers and
/// retransmissions run on both workers), each application thread drives its own RNIC's
/// worker, reports come back in RNIC order, and one worker dying takes the other down.
#[test]
fn rnics_on_two_workers_carry_verified_traffic() {
    let lossy = |h: u8, thread: u32| {
        let mut c = test_config(h, 1024);
        c.fault.loss = 0.01;
        c.fault.seed = h as u64;
        c.worker_thread = thread;
        c
    };
    let (rt, mut a, mut b) = pair_with(lossy(5, 3), lossy(6, 7), QpType::Rc);
    // Threads 3 and 7: two workers, numbered in the threads' order.
    assert_eq!(rt.workers(), 2);
    assert_eq!((rt.worker_of(0), rt.worker_of(1)), (Some(0), Some(1)));
    mixed_traffic_arrives(&mut a, &mut b, 40);
    // Each worker published its load: both found work, and its RNIC is its own.
    for w in 0..2 {
        assert!(ferroce_tests::wait_until(5, || {
            let (l, rnics) = rt.worker_load(w).unwrap();
            rnics == [w] && l.busy_polls > 0 && l.busy_ns > 0 && l.busy_ns <= l.elapsed_ns
        }));
    }
    assert!(rt.worker_load(2).is_none());
    // Each worker reports its own RNIC; the runtime puts them in RNIC order.
    let reports = rt.inspect(false, Duration::from_secs(5)).expect("reports");
    assert_eq!(reports.len(), 2);
    assert_eq!((reports[0].mac, reports[1].mac), (rt.mac(0), rt.mac(1)));
    assert!(reports.iter().all(|r| r.clients.len() == 1));
    // One worker's death is everyone's: the other worker's thread ends too, and both
    // applications are told.
    assert_eq!(rt.workers_running(), 2);
    rt.inject_worker_panic();
    assert!(ferroce_tests::wait_until(10, || !rt.alive()));
    assert!(
        ferroce_tests::wait_until(10, || rt.workers_running() == 0),
        "the second worker stopped with the first"
    );
    for ctx in [&mut a.ctx, &mut b.ctx] {
        assert!(ferroce_tests::wait_until(10, || matches!(
            ctx.alloc_pd(),
            Err(roce::engine::VerbsError::DeviceFatal)
        )));
    }
    let snaps = rt.stop();
    assert!(
        snaps[0].nic.fault_lost + snaps[1].nic.fault_lost > 0,
        "faults were injected"
    );
}

/// `worker.app_drive = false`: the application threads only post and poll, and the worker's
/// own thread does all the RNICs' work (no iteration run by an application thread); with the
/// default the waiting application threads run it themselves. Verified traffic either way.
#[test]
fn the_worker_thread_does_the_work_when_applications_do_not_drive() {
    for drive in [false, true] {
        let cfg = |h: u8| {
            let mut c = test_config(h, 1024);
            c.app_drive = drive;
            c
        };
        let (rt, mut a, mut b) = pair_with(cfg(9), cfg(10), QpType::Rc);
        mixed_traffic_arrives(&mut a, &mut b, 41);
        // A snapshot of the load published well after the traffic (about every millisecond
        // while the worker runs): what it counts includes every iteration of the traffic.
        let (seen, _) = rt.worker_load(0).expect("one worker");
        let mut load = seen;
        assert!(ferroce_tests::wait_until(5, || {
            load = rt.worker_load(0).expect("one worker").0;
            load.elapsed_ns > seen.elapsed_ns + 5_000_000
        }));
        assert!(load.busy_polls > 0);
        if drive {
            assert!(load.driven_polls > 0, "application threads ran the worker");
        } else {
            assert_eq!(load.driven_polls, 0, "no application thread ran the worker");
        }
        drop((a, b));
        rt.stop();
    }
}

/// `fault.delay_us` holds every frame an RNIC sends: an RC WRITE's completion waits for the
/// delayed request and the peer's ACK, so it takes at least the delay; the data arrives
/// intact; the frames are counted.
#[test]
fn a_delayed_port_stretches_the_round_trip() {
    const DELAY_US: u32 = 3_000;
    let mut slow = test_config(3, 1024);
    slow.fault.delay_us = DELAY_US;
    let (rt, mut a, b) = pair_with(slow, test_config(4, 1024), QpType::Rc);
    for i in 0..3u64 {
        let data = pattern(i as u32, 5000);
        a.buf.write(0, &data);
        let t = std::time::Instant::now();
        post_write_at(&mut a, &b, i, 0, 5000);
        let c = wait_cq(&mut a, 1, 10);
        assert!(c.len() == 1 && c[0].status == WcStatus::Success, "{c:?}");
        // A lower bound only: the delay can only add time, whatever the machine's load.
        assert!(
            t.elapsed() >= std::time::Duration::from_micros(DELAY_US as u64),
            "completed in {:?}, under the {DELAY_US} us delay",
            t.elapsed()
        );
        assert_eq!(b.buf.to_vec(0, 5000), data);
    }
    let snaps = rt.stop();
    let (slow, other) = (&snaps[0].nic, &snaps[1].nic);
    assert!(slow.fault_delayed >= 3, "{slow:?}");
    assert_eq!(slow.fault_delay_dropped, 0);
    assert_eq!(other.fault_delayed, 0, "only the configured port delays");
}

/// DCQCN through the dataplane: A's port marks its ECN-capable frames CE (`fault.ce`, as a
/// congested switch would), B's notification point answers with CNPs, and A's reaction point
/// cuts the QP's rate and paces it; the data still arrives intact, ACKs and CNPs are not
/// ECN-capable so only data is marked.
#[test]
fn ce_marks_bring_cnps_and_the_sender_slows_down() {
    let mut ca = test_config(3, 1024);
    ca.ecn = true;
    ca.fault.ce = 1.0;
    ca.dcqcn.rp = Some(dcb::dcqcn::RpParams::paper(10_000.0));
    let mut cb = test_config(4, 1024);
    cb.ecn = true;
    cb.dcqcn.np_min_interval_ns = Some(50_000);
    let (rt, mut a, b) = pair_with(ca, cb, QpType::Rc);
    let data = pattern(11, 64 * 1024);
    a.buf.write(0, &data);
    for i in 0..8u64 {
        post_write_at(&mut a, &b, i, 0, 64 * 1024);
        let c = wait_cq(&mut a, 1, 20);
        assert!(c.len() == 1 && c[0].status == WcStatus::Success, "{c:?}");
        assert_eq!(b.buf.to_vec(0, 64 * 1024), data);
    }
    let rate = a.ctx.query_qp(a.qpn).unwrap().rate_kbps;
    let snaps = rt.stop();
    let (sa, sb) = (&snaps[0], &snaps[1]);
    assert!(sa.nic.fault_ce_marked > 0, "{:?}", sa.nic);
    assert!(sb.qps.np_ecn_marked_roce_packets > 0, "{:?}", sb.qps);
    assert!(sb.qps.np_cnp_sent > 0, "{:?}", sb.qps);
    // The last CNP may still be on the link when the worker stops.
    assert!(
        sa.qps.rp_cnp_handled > 0 && sa.qps.rp_cnp_handled <= sb.qps.np_cnp_sent,
        "A's QP took B's CNPs: {} of {}",
        sa.qps.rp_cnp_handled,
        sb.qps.np_cnp_sent
    );
    assert_eq!(sb.nic.fault_ce_marked, 0);
    assert!(
        rate.is_some_and(|k| k < 10_000_000),
        "A's QP runs below line rate: {rate:?} kb/s"
    );
}

#[test]
fn answers_arp_ping_and_neighbour_solicitation_on_a_port() {
    use smoltcp::phy::ChecksumCapabilities;
    use smoltcp::wire::*;
    let mut cfg = test_config(3, 1024);
    cfg.ipv6 = vec![dataplane::config::Cidr {
        addr: "fd00:99::3".parse().unwrap(),
        prefix: 64,
    }];
    let (rt, mut rx, mut tx, pool) = raw_pair(cfg, "nb");
    let peer = [0x52, 0x54, 0, 0x99, 0, 2];
    // The RNIC announced itself at start: a gratuitous ARP.
    let g = receive_until(&mut rx, 5, |f| f[12..14] == [0x08, 0x06]).expect("gratuitous ARP");
    assert_eq!(&g[6..12], &rt.mac(0));
    // ARP request from the peer.
    send_frame(
        &pool,
        &mut tx,
        &arp_request(peer, [10, 99, 0, 2], [10, 99, 0, 3]),
    );
    let reply = receive_until(&mut rx, 5, |f| {
        f[12..14] == [0x08, 0x06]
            && ArpPacket::new_checked(&f[14..])
                .map(|p| p.operation() == ArpOperation::Reply)
                .unwrap_or(false)
    })
    .expect("ARP reply");
    assert_eq!(&reply[..6], &peer);
    // Ping (from the peer: `ping_frame`'s source MAC is `peer`).
    let caps = ChecksumCapabilities::default();
    let ping = ping_frame(rt.mac(0), None, 9, b"ferroce ping");
    send_frame(&pool, &mut tx, &ping);
    let pong = receive_until(&mut rx, 5, |f| f[12..14] == [0x08, 0x00] && f[14 + 9] == 1)
        .expect("echo reply");
    let rp = Ipv4Packet::new_checked(&pong[14..]).unwrap();
    let rr = Icmpv4Repr::parse(&Icmpv4Packet::new_checked(rp.payload()).unwrap(), &caps).unwrap();
    assert_eq!(
        rr,
        Icmpv4Repr::EchoReply {
            ident: 1,
            seq_no: 9,
            data: b"ferroce ping"
        }
    );
    // IPv6 neighbour solicitation for fd00:99::3.
    let target: Ipv6Address = "fd00:99::3".parse().unwrap();
    let src: Ipv6Address = "fd00:99::2".parse().unwrap();
    let ns = Icmpv6Repr::Ndisc(NdiscRepr::NeighborSolicit {
        target_addr: target,
        lladdr: Some(RawHardwareAddress::from(EthernetAddress(peer))),
    });
    let dst: Ipv6Address = "ff02::1:ff00:3".parse().unwrap();
    let ip6 = Ipv6Repr {
        src_addr: src,
        dst_addr: dst,
        next_header: IpProtocol::Icmpv6,
        payload_len: ns.buffer_len(),
        hop_limit: 255,
    };
    let mut f = vec![0u8; 14 + 40 + ns.buffer_len()];
    EthernetRepr {
        src_addr: EthernetAddress(peer),
        dst_addr: EthernetAddress([0x33, 0x33, 0xff, 0, 0, 3]),
        ethertype: EthernetProtocol::Ipv6,
    }
    .emit(&mut EthernetFrame::new_unchecked(&mut f[..]));
    let mut p = Ipv6Packet::new_unchecked(&mut f[14..]);
    ip6.emit(&mut p);
    ns.emit(
        &src,
        &dst,
        &mut Icmpv6Packet::new_unchecked(p.payload_mut()),
        &caps,
    );
    send_frame(&pool, &mut tx, &f);
    let na = receive_until(&mut rx, 5, |f| {
        f[12..14] == [0x86, 0xdd] && f[14 + 40] == 136 && f[..6] == peer
    })
    .expect("neighbour advertisement");
    assert_eq!(
        &na[14 + 24..14 + 40],
        &src.octets(),
        "sent to the solicitor"
    );
    let snap = rt.stop();
    assert!(
        snap[0].neigh.arp_replies_tx >= 1
            && snap[0].neigh.echo_replies_tx >= 1
            && snap[0].neigh.na_tx >= 1
    );
    assert_eq!(snap[0].nic.rx_arp, 1);
}

/// Sends the frame `f` from the raw end of a ring pair (`pool`'s, queue `tx`).
fn send_frame(pool: &pmd_bindings::Mempool, tx: &mut pmd_bindings::TxQueue, f: &[u8]) {
    let mut m = pool.alloc().unwrap();
    m.extend_from_slice(f);
    tx.tx_one(m).unwrap();
}

/// An ICMP echo request (identifier 1, sequence number `seq`, carrying `data`) from
/// 52:54:00:99:00:02 and 10.99.0.2 to 10.99.0.3, to `dst` at layer 2, tagged with `vlan`
/// (VID) if given.
fn ping_frame(dst: [u8; 6], vlan: Option<u16>, seq: u16, data: &[u8]) -> Vec<u8> {
    use smoltcp::phy::ChecksumCapabilities;
    use smoltcp::wire::*;
    let caps = ChecksumCapabilities::default();
    let echo = Icmpv4Repr::EchoRequest {
        ident: 1,
        seq_no: seq,
        data,
    };
    let ip = Ipv4Repr {
        src_addr: "10.99.0.2".parse().unwrap(),
        dst_addr: "10.99.0.3".parse().unwrap(),
        next_header: IpProtocol::Icmp,
        payload_len: echo.buffer_len(),
        hop_limit: 64,
    };
    let mut f = vec![0u8; 14 + 20 + echo.buffer_len()];
    EthernetRepr {
        src_addr: EthernetAddress([0x52, 0x54, 0, 0x99, 0, 2]),
        dst_addr: EthernetAddress(dst),
        ethertype: EthernetProtocol::Ipv4,
    }
    .emit(&mut EthernetFrame::new_unchecked(&mut f[..]));
    let mut p = Ipv4Packet::new_unchecked(&mut f[14..]);
    ip.emit(&mut p, &caps);
    echo.emit(&mut Icmpv4Packet::new_unchecked(p.payload_mut()), &caps);
    if let Some(vid) = vlan {
        // 802.1Q tag after the MACs: TPID 0x8100, PCP 3, the VID.
        let tci = (3u16 << 13) | vid;
        let tag = [0x81, 0x00, (tci >> 8) as u8, tci as u8];
        f.splice(12..12, tag);
    }
    f
}

/// The RNIC filters at layer 2 as a NIC does: another station's unicast MAC, a VLAN that is
/// not ours, and broadcast other than ARP are dropped (counted), while our MAC untagged or
/// priority-tagged (VID 0) is answered.
#[test]
fn frames_for_other_stations_or_vlans_are_dropped() {
    let cfg = test_config(3, 1024);
    let (rt, mut rx, mut tx, pool) = raw_pair(cfg, "l2f");
    let ours = rt.mac(0);
    let send = |tx: &mut pmd_bindings::TxQueue, f: &[u8]| send_frame(&pool, tx, f);
    let ping = |dst, vlan, seq| ping_frame(dst, vlan, seq, b"l2 filter");
    let is_reply = |f: &[u8], seq: u16| {
        let off = if f[12..14] == [0x81, 0x00] { 18 } else { 14 };
        f[off - 2..off] == [0x08, 0x00]
            && f[off + 9] == 1
            && f[off + 20] == 0
            && f[off + 26..off + 28] == seq.to_be_bytes()
    };
    // Dropped: another station's MAC, VLAN 100, broadcast ICMP.
    send(&mut tx, &ping([0x52, 0x54, 0, 0x99, 0, 7], None, 1));
    send(&mut tx, &ping(ours, Some(100), 2));
    send(&mut tx, &ping([0xff; 6], None, 3));
    // Answered: our MAC untagged and priority-tagged.
    send(&mut tx, &ping(ours, None, 4));
    send(&mut tx, &ping(ours, Some(0), 5));
    let mut seen = Vec::new();
    receive_until(&mut rx, 3, |f| {
        for seq in 1..=5 {
            if is_reply(f, seq) {
                seen.push(seq);
            }
        }
        seen.len() >= 2 && seen.contains(&5)
    });
    // Anything late for the dropped ones would show up within a second.
    receive_until(&mut rx, 1, |f| {
        for seq in 1..=3 {
            if is_reply(f, seq) {
                seen.push(seq);
            }
        }
        false
    });
    seen.sort();
    assert_eq!(seen, vec![4, 5], "only the frames for us are answered");
    let snap = rt.stop();
    assert_eq!(snap[0].nic.rx_dropped_mac, 2);
    assert_eq!(snap[0].nic.rx_dropped_vlan, 1);
    assert_eq!(snap[0].neigh.echo_replies_tx, 2);
}

#[test]
fn unresolvable_peer_fails_the_qp_with_a_clear_error() {
    let cfg = test_config(3, 1024);
    let (rt, mut rx, _tx, _pool) = raw_pair(cfg, "unres");
    let mut a = side(rt.open(0).unwrap(), QpType::Rc, 65536, 16);
    // Nobody answers ARP for 10.99.0.9. While the packet waits for the address, ACK timeouts
    // cost no retries; resolution fails after 6 tries (2.55 s) and the QP reports that.
    let (q, g) = (Qpn::new(0x55), Gid::from_ipv4([10, 99, 0, 9]));
    connect_with(&mut a, q, g, Mtu::M1024, 1, 1, QpType::Rc, 18);
    // The destination is resolved when the QP moves to RTR, before anything is posted (as
    // an RNIC's driver resolves the destination MAC in modify_qp), so a QP's first packets
    // need not wait for ARP.
    let asked = receive_until(&mut rx, 2, |f| {
        f[12..14] == [0x08, 0x06] && f[20..22] == [0, 1] && f[38..42] == [10, 99, 0, 9]
    });
    assert!(
        asked.is_some(),
        "no ARP request when the QP got its destination"
    );
    post_signaled(
        &mut a,
        1,
        WrOp::Write {
            remote_addr: 0,
            rkey: roce::types::Rkey(1),
        },
        0,
        8,
    );
    let c = wait_cq(&mut a, 1, 15);
    assert_eq!(
        c.first().map(|c| (c.status, c.vendor_err)),
        Some((WcStatus::WrFlushErr, vendor_err::PEER_UNREACHABLE)),
        "the completion names the cause: {c:?}"
    );
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut ev = None;
    while ev.is_none() && Instant::now() < deadline {
        ev = a.ctx.poll_event();
    }
    assert_eq!(ev, Some(AsyncEvent::QpFatal(a.qpn)));
    let snap = rt.stop();
    assert_eq!(snap[0].nic.qps_failed_unresolved, 1);
    assert!(snap[0].neigh.arp_requests_tx >= 6, "six ARP attempts");
}

/// A UD (and a UC) QP's burst to a peer whose MAC is not known yet: while ARP resolves, the
/// QP sends nothing beyond its first packet (held for the address) and the rest wait in its
/// send queue, so a burst far larger than the dataplane's hold list (256 frames) reaches the
/// wire whole, in order, once the peer answers. (Before, every packet was built at once, and
/// those past the hold list were dropped while their sends completed successfully.)
#[test]
fn unacknowledged_sends_wait_in_the_send_queue_while_the_next_hop_resolves() {
    // One RNIC for both (each raw_pair adds a mempool, and this binary's tests share a
    // bounded EAL memory): a UD burst to one unresolved peer, then a UC burst to another.
    let cfg = test_config(3, 1024);
    let (rt, mut rx, mut tx, pool) = raw_pair(cfg, "held_uxd");
    let mut link = RawLink {
        ours: rt.mac(0),
        rx: &mut rx,
        tx: &mut tx,
        pool: &pool,
    };
    burst_waits_for_the_next_hop(&rt, &mut link, QpType::Ud, 2);
    burst_waits_for_the_next_hop(&rt, &mut link, QpType::Uc, 5);
    each_datagram_gets_its_own_headers(&rt, &mut link);
    let snap = rt.stop();
    assert_eq!(snap[0].nic.tx_held_dropped, 0);
    assert!(snap[0].nic.tx_held >= 2);
}

/// The hand-driven end of a [`raw_pair`].
struct RawLink<'a> {
    ours: [u8; 6],
    rx: &'a mut pmd_bindings::RxQueue,
    tx: &'a mut pmd_bindings::TxQueue,
    pool: &'a pmd_bindings::Mempool,
}

/// 600 sends on a new `t` QP to 10.99.0.`host`, whose ARP answer comes 100 ms late: all
/// reach the wire, in order, and complete.
fn burst_waits_for_the_next_hop(rt: &Runtime, link: &mut RawLink<'_>, t: QpType, host: u8) {
    const N: u64 = 600;
    let peer_ip = [10, 99, 0, host];
    let peer_mac = [0x52, 0x54, 0, 0x99, 0, host];
    let peer_gid = Gid::from_ipv4(peer_ip);
    let mut a = side(rt.open(0).unwrap(), t, 65536, 1024);
    connect_with(&mut a, Qpn::new(0x77), peer_gid, Mtu::M1024, 1, 1, t, 14);
    let ud = (t == QpType::Ud).then_some(UdDest {
        ah: AddressVector::new(peer_gid, 1),
        remote_qpn: Qpn::new(0x77),
        remote_qkey: Qkey(0x1111_1111),
    });
    for i in 0..N {
        a.buf.write(i as usize * 64, &i.to_be_bytes());
        post_signaled_to(&mut a, i, WrOp::Send, i * 64, 64, ud);
    }
    // Ethernet 14 + IPv4 20 + UDP 8 + BTH 12 (+ DETH 8 for UD): the payload's first bytes.
    let at = if t == QpType::Ud { 62 } else { 54 };
    let mut burst: Vec<Mbuf> = Vec::with_capacity(32);
    let t0 = Instant::now();
    let mut asked = None;
    let mut answered = false;
    let mut got: Vec<u64> = Vec::new();
    while t0.elapsed() < Duration::from_secs(10) && got.len() < N as usize {
        link.rx.rx_burst(&mut burst);
        for m in burst.drain(..) {
            let f = m.to_vec();
            if f[12..14] == [0x08, 0x06] && f[20..22] == [0, 1] && f[38..42] == peer_ip {
                asked.get_or_insert_with(Instant::now);
            } else if frame::classify(&f) == FrameKind::Roce && f[30..34] == peer_ip {
                assert_eq!(f[..6], peer_mac, "sent to the resolved MAC");
                got.push(u64::from_be_bytes(f[at..at + 8].try_into().unwrap()));
            }
        }
        if !answered && asked.is_some_and(|t| t.elapsed() >= Duration::from_millis(100)) {
            answered = true;
            let mut r = link.pool.alloc().unwrap();
            r.extend_from_slice(&arp_reply(peer_mac, peer_ip, link.ours, [10, 99, 0, 3]));
            link.tx.tx_one(r).unwrap();
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    assert!(answered, "{t:?}: ferroce asked for the peer's MAC");
    assert_eq!(
        got,
        (0..N).collect::<Vec<_>>(),
        "{t:?}: every packet, in order"
    );
    let c = wait_cq(&mut a, N as usize, 10);
    assert_eq!(c.len(), N as usize);
    assert!(c.iter().all(|c| c.status == WcStatus::Success));
}

/// A UD QP sending to two destinations in turn, with different MACs, traffic classes and
/// hop limits: the QP's header template is made for one and must be made again for the
/// other, so every frame carries its own destination's Ethernet and IP header (and a
/// correct IPv4 checksum and ICRC), never the previous datagram's.
fn each_datagram_gets_its_own_headers(rt: &Runtime, link: &mut RawLink<'_>) {
    const N: u64 = 40;
    let mut a = side(rt.open(0).unwrap(), QpType::Ud, 65536, 256);
    let dests = [
        ([10, 99, 0, 7], [0x52, 0x54, 0, 0x99, 0, 7], 0x68u8, 9u8),
        ([10, 99, 0, 8], [0x52, 0x54, 0, 0x99, 0, 8], 0xb8, 33),
    ];
    connect_with(
        &mut a,
        Qpn::new(0x78),
        Gid::from_ipv4(dests[0].0),
        Mtu::M1024,
        1,
        1,
        QpType::Ud,
        14,
    );
    for i in 0..N {
        let (ip, mac, tc, ttl) = dests[i as usize % 2];
        let mut ah = AddressVector::new(Gid::from_ipv4(ip), 1);
        ah.dmac = Some(mac);
        ah.traffic_class = tc;
        ah.hop_limit = ttl;
        let ud = UdDest {
            ah,
            remote_qpn: Qpn::new(0x78),
            remote_qkey: Qkey(0x1111_1111),
        };
        a.buf.write(i as usize * 64, &i.to_be_bytes());
        post_signaled_to(&mut a, i, WrOp::Send, i * 64, 64, Some(ud));
    }
    let mut burst: Vec<Mbuf> = Vec::with_capacity(32);
    let t0 = Instant::now();
    let mut got = 0;
    while t0.elapsed() < Duration::from_secs(10) && got < N {
        link.rx.rx_burst(&mut burst);
        for m in burst.drain(..) {
            let f = m.to_vec();
            if frame::classify(&f) != FrameKind::Roce {
                continue;
            }
            let p = frame::parse(&f).expect("a valid frame (IPv4 checksum included)");
            assert_eq!(p.icrc_received, p.icrc_computed, "ICRC");
            // The payload's first 8 bytes are the datagram's index.
            let i = u64::from_be_bytes(f[62..70].try_into().unwrap());
            assert_eq!(i, got, "in order");
            let (ip, mac, tc, ttl) = dests[i as usize % 2];
            assert_eq!(f[..6], mac, "datagram {i}: its destination's MAC");
            assert_eq!(f[30..34], ip, "datagram {i}: its destination's IP");
            assert_eq!(f[15] & !3, tc & !3, "datagram {i}: its DSCP");
            assert_eq!(f[22], ttl, "datagram {i}: its TTL");
            got += 1;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    assert_eq!(got, N, "every datagram reached the wire");
    let c = wait_cq(&mut a, N as usize, 10);
    assert!(c.len() == N as usize && c.iter().all(|c| c.status == WcStatus::Success));
}

/// An ARP reply from `mac`/`ip` to `to_mac`/`to_ip`.
fn arp_reply(mac: [u8; 6], ip: [u8; 4], to_mac: [u8; 6], to_ip: [u8; 4]) -> Vec<u8> {
    use smoltcp::wire::*;
    let mut f = vec![0u8; 60];
    EthernetRepr {
        src_addr: EthernetAddress(mac),
        dst_addr: EthernetAddress(to_mac),
        ethertype: EthernetProtocol::Arp,
    }
    .emit(&mut EthernetFrame::new_unchecked(&mut f[..]));
    ArpRepr::EthernetIpv4 {
        operation: ArpOperation::Reply,
        source_hardware_addr: EthernetAddress(mac),
        source_protocol_addr: ip.into(),
        target_hardware_addr: EthernetAddress(to_mac),
        target_protocol_addr: to_ip.into(),
    }
    .emit(&mut ArpPacket::new_unchecked(&mut f[14..42]));
    f
}

/// A peer whose first ARP answers are lost: the QP's packets wait for the address, and the
/// ACK timeouts meanwhile cost no retries (the packets never left), so a QP whose whole retry
/// budget (8 x ~1 ms) is far shorter than the resolution (the third request, at 150 ms)
/// still completes its WRITE. The peer is a sans-IO engine driving the other end of the link.
#[test]
fn retries_are_not_spent_while_the_next_hop_resolves() {
    use roce::engine::{Device, DeviceConfig, QpInit, Transmit};
    use roce::memory::HeapMemory;
    let cfg = test_config(3, 1024);
    let (rt, mut rx, mut tx, pool) = raw_pair(cfg, "held");
    let ours = rt.mac(0);
    let peer_mac = [0x52, 0x54, 0, 0x99, 0, 2];
    let peer_gid = Gid::from_ipv4([10, 99, 0, 2]);
    // The peer engine: PD, CQ, MR, an RC QP towards ferroce's.
    let mut peer = Device::new(DeviceConfig {
        gids: vec![peer_gid],
        ..Default::default()
    });
    let pd = peer.alloc_pd().unwrap();
    let cq = peer.create_cq(64).unwrap();
    let mem = HeapMemory::shared(65536);
    let (_, rkey) = peer
        .reg_mr(pd, mem.clone(), 0, 0x5000_0000, 65536, Access::ALL)
        .unwrap();
    let pq = peer
        .create_qp(&QpInit {
            caps: QpCaps {
                max_send_wr: 16,
                max_recv_wr: 16,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            ..QpInit::rc(pd, cq)
        })
        .unwrap();
    let mut a = side(rt.open(0).unwrap(), QpType::Rc, 65536, 16);
    let ours_gid = a.gid;
    roce::sim::bring_up(
        &mut peer,
        &roce::sim::Endpoint {
            pd,
            cq,
            qpn: pq,
            mem: mem.clone(),
            addr: 0x5000_0000,
            lkey: roce::types::Lkey(0),
            rkey: rkey.unwrap(),
            sq_psn: Psn::new(9),
        },
        a.qpn,
        ours_gid,
        &roce::sim::ConnectOpts::default(),
        9,
        1,
    );
    connect_with(&mut a, pq, peer_gid, Mtu::M1024, 1, 9, QpType::Rc, 8);
    a.buf.write(0, &[0x3c; 512]);
    post_signaled(
        &mut a,
        1,
        WrOp::Write {
            remote_addr: 0x5000_0000,
            rkey: rkey.unwrap(),
        },
        0,
        512,
    );
    // Drive the peer: ignore the first two ARP requests, answer later ones; feed RoCE frames
    // to the engine and put its answers on the link.
    let t0 = Instant::now();
    let mut arp_requests = 0;
    let mut burst: Vec<Mbuf> = Vec::with_capacity(32);
    let mut out = Transmit::default();
    let mut buf = vec![0u8; 9000];
    let mut done = Vec::new();
    while t0.elapsed() < Duration::from_secs(5) && done.is_empty() {
        rx.rx_burst(&mut burst);
        let now = t0.elapsed().as_nanos() as u64;
        for m in burst.drain(..) {
            let f = m.to_vec();
            if f[12..14] == [0x08, 0x06] && f[20..22] == [0, 1] && f[38..42] == [10, 99, 0, 2] {
                arp_requests += 1;
                if arp_requests > 2 {
                    let mut r = pool.alloc().unwrap();
                    r.extend_from_slice(&arp_reply(peer_mac, [10, 99, 0, 2], ours, [10, 99, 0, 3]));
                    tx.tx_one(r).unwrap();
                }
            } else if frame::classify(&f) == FrameKind::Roce {
                peer.handle_frame(now, &f);
            }
        }
        while peer.poll_transmit(now, &mut out) {
            let n = peer
                .write_frame(&out, peer_mac, ours, None, 1, &mut buf)
                .unwrap();
            let mut r = pool.alloc().unwrap();
            r.extend_from_slice(&buf[..n]);
            tx.tx_one(r).unwrap();
        }
        let mut wc = [Completion::default(); 4];
        let k = a.ctx.poll_cq(a.cq, &mut wc).unwrap();
        done.extend_from_slice(&wc[..k]);
        std::thread::sleep(Duration::from_micros(200));
    }
    assert_eq!(arp_requests, 3, "answered at the third request");
    assert_eq!(
        done.iter().map(|c| c.status).collect::<Vec<_>>(),
        vec![WcStatus::Success]
    );
    assert_eq!(mem.to_vec(0, 512), vec![0x3c; 512]);
    let c = a.ctx.counters(Some(a.qpn)).unwrap();
    let get = |n: &str| c.iter().find(|(k, _)| *k == n).unwrap().1;
    assert!(get("ack_timeouts_held") > 50, "{c:?}");
    assert_eq!(get("local_ack_timeout_err"), 0);
    drop(a);
    rt.stop();
}

/// rxe's request frames (tests/corpus) replayed through net_pcap into a ferroce RNIC set up
/// with the capture's addresses and QP state: the tx_pcap holds rxe's responses.
#[test]
fn net_pcap_replay_of_rxe_requests_gives_rxe_responses() {
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    for case in ["write_bw_4k", "read_lat", "atomic_faa"] {
        replay(&corpus, case);
    }
}

fn replay(corpus: &Path, case: &str) {
    let data = std::fs::read(corpus.join(format!("{case}.pcap"))).unwrap();
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(corpus.join(format!("{case}.json"))).unwrap())
            .unwrap();
    let hex = |v: &serde_json::Value| {
        u64::from_str_radix(v.as_str().unwrap().trim_start_matches("0x"), 16).unwrap()
    };
    let adv = json["advertised"].as_array().unwrap();
    let (client, server) = (&adv[0], &adv[1]);
    let (c_qpn, c_psn) = (hex(&client["qpn"]) as u32, hex(&client["psn"]) as u32);
    let (s_psn, s_va) = (hex(&server["psn"]) as u32, hex(&server["vaddr"]));
    let frames: Vec<Vec<u8>> = roce::pcap::Reader::new(&data)
        .unwrap()
        .map(|r| r.unwrap().data.to_vec())
        .collect();
    let parsed: Vec<(frame::ParsedFrame, &Vec<u8>)> = frames
        .iter()
        .filter_map(|f| frame::parse(f).ok().map(|p| (p, f)))
        .collect();
    let from =
        |p: &frame::ParsedFrame, last: u8| p.repr.ip.gids().0 == Gid::from_ipv4([10, 99, 0, last]);
    // A fresh device numbers its first QP 0x11 and first MR key 0x101: rewrite the client's
    // requests for them (and recompute the ICRC); the VA is kept by registering at it.
    let (our_qpn, our_rkey) = (Qpn::new(0x11), roce::types::Rkey(0x101));
    let dir = std::env::temp_dir().join(format!("ferroce-replay-{case}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (rx_path, tx_path) = (dir.join("rx.pcap"), dir.join("tx.pcap"));
    {
        let mut w = roce::pcap::Writer::new(std::io::BufWriter::new(
            std::fs::File::create(&rx_path).unwrap(),
        ))
        .unwrap();
        // The client announces itself first, so the RNIC knows where to answer.
        let client_mac: [u8; 6] = parsed
            .iter()
            .find(|(p, _)| from(p, 2))
            .unwrap()
            .0
            .repr
            .eth
            .src;
        w.write(0, &arp_request(client_mac, [10, 99, 0, 2], [10, 99, 0, 4]))
            .unwrap();
        for (p, f) in &parsed {
            if !(from(p, 2) && p.info().is_request) {
                continue;
            }
            let mut r = p.repr;
            r.transport.bth.dest_qp = our_qpn;
            if let Some(x) = r.transport.ext.reth.as_mut() {
                x.rkey = our_rkey;
            }
            if let Some(x) = r.transport.ext.atomic_eth.as_mut() {
                x.rkey = our_rkey;
            }
            let mut out = vec![0u8; p.frame_len];
            r.emit(&mut out, p.payload(f)).unwrap();
            w.write(0, &out).unwrap();
        }
        w.into_inner().unwrap();
    }
    let mut cfg = test_config(4, 1024);
    cfg.mac = Some([0x52, 0x54, 0, 0x99, 0, 4]);
    cfg.credits_from_rq = false; // rxe advertises no credits
    cfg.ack_coalescing = false; // and ACKs every AckReq packet
    dataplane::runtime::init_eal("ferroce-tests", &cfg).unwrap();
    let pool = Runtime::pool(&cfg).unwrap();
    let devargs = format!(
        "net_pcap_{case},rx_pcap={},tx_pcap={}",
        rx_path.display(),
        tx_path.display()
    );
    let port = Port::probe(&devargs, &Runtime::port_config(&cfg), pool.clone()).unwrap();
    let mut nic = Nic::new(cfg, port, pool).unwrap();
    // The server's QP and MR, set up before the worker reads the first frame.
    let mem = std::sync::Arc::new(ferroce_host::abi::area::Area::new(16 << 20, "replay").unwrap());
    let dev = &mut nic.dev;
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(4096).unwrap();
    let qpn = dev.create_qp(&roce::engine::QpInit::rc(pd, cq)).unwrap();
    assert_eq!(qpn, our_qpn);
    let base = s_va & !0xfff;
    let (_, rkey) = dev
        .reg_mr(pd, mem.clone(), 0, base, 16 << 20, Access::ALL)
        .unwrap();
    assert_eq!(rkey, Some(our_rkey));
    // Memory holds what rxe's did where the requests read it.
    prefill(&parsed, &mem, base);
    let ep = roce::sim::Endpoint {
        pd,
        cq,
        qpn,
        mem: roce::memory::HeapMemory::shared(8),
        addr: base,
        lkey: roce::types::Lkey(0x101),
        rkey: our_rkey,
        sq_psn: Psn::new(s_psn),
    };
    let o = roce::sim::ConnectOpts {
        mtu: Mtu::M1024,
        rd_atomic: 128,
        sgid_index: 1,
        ..Default::default()
    };
    roce::sim::bring_up(
        dev,
        &ep,
        Qpn::new(c_qpn),
        Gid::from_ipv4([10, 99, 0, 2]),
        &o,
        s_psn,
        c_psn,
    );
    let rt = Runtime::with_nics(vec![nic]).unwrap();
    // Wait until every request was answered (the capture's response count), then stop (which
    // closes the port and flushes the tx pcap).
    let want = parsed
        .iter()
        .filter(|(p, _)| {
            from(p, 4) && !p.info().is_request && p.repr.transport.bth.dest_qp.value() == c_qpn
        })
        .count();
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline && (rt.stats(0).nic.tx_roce as usize) < want {
        std::thread::sleep(Duration::from_millis(20));
    }
    rt.stop();
    let out = std::fs::read(&tx_path).unwrap();
    let ours: Vec<(frame::ParsedFrame, Vec<u8>)> = roce::pcap::Reader::new(&out)
        .unwrap()
        .filter_map(|r| {
            let f = r.unwrap().data.to_vec();
            (frame::classify(&f) == FrameKind::Roce)
                .then(|| (frame::parse(&f).expect("valid ICRC and IPv4 checksum"), f))
        })
        .collect();
    let theirs: Vec<_> = parsed
        .iter()
        .filter(|(p, _)| {
            from(p, 4) && !p.info().is_request && p.repr.transport.bth.dest_qp.value() == c_qpn
        })
        .collect();
    assert_eq!(ours.len(), theirs.len(), "{case}: number of responses");
    for (i, ((o, of), (t, tf))) in ours.iter().zip(theirs).enumerate() {
        let (ot, tt) = (&o.repr.transport, &t.repr.transport);
        assert_eq!(ot.bth.opcode, tt.bth.opcode, "{case} response {i}");
        assert_eq!(ot.bth.psn, tt.bth.psn, "{case} response {i}");
        assert_eq!(ot.bth.dest_qp, tt.bth.dest_qp, "{case} response {i}");
        assert_eq!(
            ot.ext.aeth, tt.ext.aeth,
            "{case} response {i}: syndrome and MSN"
        );
        assert_eq!(ot.ext.atomic_ack, tt.ext.atomic_ack, "{case} response {i}");
        assert_eq!(o.payload(of), t.payload(tf), "{case} response {i}: data");
        // rxe's port formula, applied to our QPN (which differs from the capture's).
        let sport = roce::engine::transmit::udp_sport_connected(0, our_qpn.value(), c_qpn);
        assert_eq!(
            o.repr.udp_src_port, sport,
            "{case}: UDP source port as rxe picks it"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn prefill(
    parsed: &[(frame::ParsedFrame, &Vec<u8>)],
    mem: &ferroce_host::abi::area::Area,
    base: u64,
) {
    use roce::wire::opcode::Operation;
    // READ responses: the data at the request's address; ATOMIC ACKs: the original value.
    let mut reads = std::collections::HashMap::new();
    for (p, _) in parsed {
        let t = &p.repr.transport;
        if p.info().op == Operation::ReadRequest {
            reads.insert(t.bth.psn.value(), t.ext.reth.unwrap());
        }
    }
    let mut atomics = std::collections::HashMap::new();
    for (p, _) in parsed {
        let t = &p.repr.transport;
        if matches!(p.info().op, Operation::FetchAdd | Operation::CompareSwap) {
            atomics.insert(t.bth.psn.value(), t.ext.atomic_eth.unwrap());
        }
    }
    for (p, f) in parsed {
        let t = &p.repr.transport;
        match p.info().op {
            Operation::ReadResponse => {
                // Find the READ whose PSN range covers this response.
                for k in 0..64u32 {
                    if let Some(r) = reads.get(&t.bth.psn.sub(k).value()) {
                        let at = r.va + k as u64 * 1024 - base;
                        roce::memory::Memory::write(mem, at as usize, p.payload(f)).unwrap();
                        break;
                    }
                }
            }
            Operation::AtomicAcknowledge => {
                if let Some(a) = atomics.get(&t.bth.psn.value()) {
                    let off = (a.va - base) as usize;
                    let mut cur = [0u8; 8];
                    mem.read_at(off, &mut cur).unwrap();
                    if cur == [0; 8] {
                        mem.write_at(off, &t.ext.atomic_ack.unwrap().orig.to_ne_bytes())
                            .unwrap();
                    }
                }
            }
            _ => {}
        }
    }
}

fn arp_request(mac: [u8; 6], sip: [u8; 4], tip: [u8; 4]) -> Vec<u8> {
    use smoltcp::wire::*;
    let mut f = vec![0u8; 60];
    EthernetRepr {
        src_addr: EthernetAddress(mac),
        dst_addr: EthernetAddress::BROADCAST,
        ethertype: EthernetProtocol::Arp,
    }
    .emit(&mut EthernetFrame::new_unchecked(&mut f[..]));
    ArpRepr::EthernetIpv4 {
        operation: ArpOperation::Request,
        source_hardware_addr: EthernetAddress(mac),
        source_protocol_addr: sip.into(),
        target_hardware_addr: EthernetAddress([0; 6]),
        target_protocol_addr: tip.into(),
    }
    .emit(&mut ArpPacket::new_unchecked(&mut f[14..42]));
    f
}

/// The PFC tests' RNIC: PFC on priority 3, a 1 Gb/s port (a pause of 0xffff quanta then
/// lasts 33.5 ms), two UD QPs in two contexts, one sending on priority 3, one on 0, to a
/// peer driven by hand (its MAC in the address handle: no ARP).
struct PfcRig {
    rt: Runtime,
    rx: pmd_bindings::RxQueue,
    tx: pmd_bindings::TxQueue,
    pool: std::sync::Arc<pmd_bindings::Mempool>,
    qps: [Side; 2],
    sent: u64,
}

const PEER_MAC: [u8; 6] = [0x52, 0x54, 0, 0x99, 0, 2];

impl PfcRig {
    fn new(name: &str, watchdog: Option<dataplane::config::PfcWatchdog>) -> PfcRig {
        let mut cfg = test_config(3, 1024);
        // A smaller pool than the default 8192 mbufs: this binary's raw pairs keep theirs to
        // the end (their ports stay open), in one bounded EAL memory.
        cfg.mbufs = (cfg.rx_desc as u32 + cfg.tx_desc as u32 + 1024).max(2560);
        cfg.speed_gbps = 1;
        cfg.pfc = dataplane::config::PfcConfig {
            mode: dcb::pfc::Mode::Pfc { enabled: 1 << 3 },
            watchdog,
            ..Default::default()
        };
        let (rt, rx, tx, pool) = raw_pair(cfg, name);
        let mk = |rt: &Runtime| {
            let mut s = side(rt.open(0).unwrap(), QpType::Ud, 1 << 16, 64);
            let gid = s.gid;
            connect_with(
                &mut s,
                Qpn::new(0x99),
                gid,
                Mtu::M1024,
                1,
                1,
                QpType::Ud,
                ACK_TIMEOUT,
            );
            s
        };
        let qps = [mk(&rt), mk(&rt)];
        PfcRig {
            rt,
            rx,
            tx,
            pool,
            qps,
            sent: 0,
        }
    }

    /// Posts a UD SEND on QP `i` (0: priority 3, 1: priority 0); returns its wr_id.
    fn send(&mut self, i: usize) -> u64 {
        self.sent += 1;
        let mut ah = AddressVector::new(Gid::from_ipv4([10, 99, 0, 4]), 0);
        ah.dmac = Some(PEER_MAC);
        ah.sl = if i == 0 { 3 } else { 0 };
        self.post(i, ah, self.sent, 0);
        self.sent
    }

    /// Posts a 64-byte UD SEND on QP `i` at service level `sl` (3 or 0: the priority) to
    /// the peer without its MAC (the RNIC resolves it), its payload starting with `marker`.
    fn send_unresolved(&mut self, i: usize, sl: u8, marker: u8) {
        let mut ah = AddressVector::new(Gid::from_ipv4([10, 99, 0, 4]), 0);
        ah.sl = sl;
        let at = marker as u64 * 64;
        self.qps[i].buf.write(at as usize, &[marker; 64]);
        self.post(i, ah, marker as u64, at);
    }

    /// A signaled 64-byte UD SEND on QP `i` from offset `at` of its buffer, along `ah`.
    fn post(&mut self, i: usize, ah: AddressVector, wr_id: u64, at: u64) {
        let dest = UdDest {
            ah,
            remote_qpn: Qpn::new(0x99),
            remote_qkey: Qkey(0x1111_1111),
        };
        post_signaled_to(&mut self.qps[i], wr_id, WrOp::Send, at, 64, Some(dest));
    }

    /// The first payload byte of every UD frame the RNIC sent since the last call.
    fn markers(&mut self) -> Vec<u8> {
        self.ud_frames().into_iter().map(|(_, b)| b).collect()
    }

    /// Sends a PFC frame for priority 3 from the peer and waits until the RNIC counted it.
    fn pfc(&mut self, quanta: u16) {
        let before = self.rt.stats(0).nic.rx_pfc;
        let f = dcb::pfc::PauseFrame::pfc_one(3, quanta).emit(PEER_MAC);
        let mut m = self.pool.alloc().unwrap();
        assert!(m.extend_from_slice(&f));
        let mut v = vec![m];
        assert_eq!(self.tx.tx_burst(&mut v), 1);
        let t = Instant::now();
        while self.rt.stats(0).nic.rx_pfc == before {
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "the PFC frame was not taken"
            );
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// Keeps priority 3 paused for `ms` milliseconds (XOFF refreshed every 2 ms); returns
    /// the UD frames the RNIC sent meanwhile ([`PfcRig::ud_frames`]).
    fn keep_paused(&mut self, ms: u64) -> Vec<(Qpn, u8)> {
        let t = Instant::now();
        let mut seen = Vec::new();
        while t.elapsed() < Duration::from_millis(ms) {
            seen.extend(self.ud_frames());
            self.pfc(0xffff);
            std::thread::sleep(Duration::from_millis(2));
        }
        seen
    }

    /// The source QPs of the UD frames the RNIC sent since the last call.
    fn senders(&mut self) -> Vec<Qpn> {
        self.ud_frames().into_iter().map(|(q, _)| q).collect()
    }

    /// The UD frames the RNIC sent since the last call: source QP and first payload byte.
    fn ud_frames(&mut self) -> Vec<(Qpn, u8)> {
        let mut out = Vec::new();
        let mut burst: Vec<Mbuf> = Vec::with_capacity(32);
        self.rx.rx_burst(&mut burst);
        for m in burst.drain(..) {
            let f = m.to_vec();
            if let Ok(p) = frame::parse(&f) {
                if let (Some(d), Some(&b)) = (p.repr.transport.ext.deth, f.get(p.payload_offset)) {
                    out.push((d.src_qp, b));
                }
            }
        }
        out
    }

    /// Waits up to `secs` for a frame from QP `i`.
    fn wait_from(&mut self, i: usize, secs: u64) -> Option<Duration> {
        let t = Instant::now();
        let q = self.qps[i].qpn;
        while t.elapsed() < Duration::from_secs(secs) {
            if self.senders().contains(&q) {
                return Some(t.elapsed());
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        None
    }
}

/// A PFC XOFF for priority 3 holds the QP that sends on it (its send does not complete, no
/// frame leaves) while the QP on priority 0 goes on; XON releases it at once, and a pause
/// left to run out ends after its quanta.
#[test]
fn pfc_pauses_one_priority_while_another_flows() {
    let mut r = PfcRig::new("pfc", None);
    r.send(0);
    r.send(1);
    let (q0, q1) = (r.qps[0].qpn, r.qps[1].qpn);
    let mut seen = Vec::new();
    let t = Instant::now();
    while !(seen.contains(&q0) && seen.contains(&q1)) {
        assert!(t.elapsed() < Duration::from_secs(5), "unpaused: {seen:?}");
        seen.extend(r.senders());
        std::thread::sleep(Duration::from_micros(200));
    }
    // XOFF, refreshed every 2 ms for 20 ms: priority 3 waits, priority 0 does not.
    r.pfc(0xffff);
    r.send(0);
    r.send(1);
    let seen: Vec<Qpn> = r.keep_paused(20).into_iter().map(|(q, _)| q).collect();
    assert!(seen.contains(&r.qps[1].qpn), "priority 0 flows");
    assert!(
        !seen.contains(&r.qps[0].qpn),
        "priority 3 is paused: {seen:?}"
    );
    assert!(
        wait_cq(&mut r.qps[0], 1, 0).is_empty(),
        "its send waits too"
    );
    // XON: it goes at once (well within the 33 ms left of the last pause).
    r.pfc(0);
    let after = r.wait_from(0, 5).expect("released by XON");
    assert!(after < Duration::from_millis(30), "{after:?}");
    // A pause left alone ends after 0xffff quanta at 1 Gb/s (33.5 ms).
    r.pfc(0xffff);
    let t = Instant::now();
    r.send(0);
    r.wait_from(0, 5).expect("released when the pause ran out");
    assert!(
        t.elapsed() >= Duration::from_millis(30),
        "{:?}",
        t.elapsed()
    );
    let s = r.rt.stop();
    assert!(s[0].nic.rx_pfc >= 4, "{:?}", s[0].nic);
    assert_eq!(s[0].nic.pfc_storms_detected, 0);
    assert_eq!(
        s[0].nic.pfc_hw_priorities, 0,
        "a ring port does PFC in software"
    );
}

/// A UD datagram on priority 3 waits for the peer's MAC; priority 3 is paused; the MAC
/// comes. The datagram now waits for the pause, but its QP need not: its next datagram, on
/// priority 0, leaves at once, and the held one follows the XON. (Before, the QP stayed
/// parked for the address until the pause ended.)
#[test]
fn a_ud_qp_goes_on_while_its_resolved_datagram_waits_for_a_pause() {
    let mut r = PfcRig::new("pfc_known", None);
    let peer = [10, 99, 0, 4];
    r.send_unresolved(0, 3, 1);
    let asked = receive_until(&mut r.rx, 5, |f| {
        f[12..14] == [0x08, 0x06] && f[20..22] == [0, 1] && f[38..42] == peer
    });
    assert!(asked.is_some(), "no ARP request for the peer");
    r.pfc(0xffff);
    r.send_unresolved(0, 0, 2);
    let mut m = r.pool.alloc().unwrap();
    assert!(m.extend_from_slice(&arp_reply(PEER_MAC, peer, r.rt.mac(0), [10, 99, 0, 3])));
    assert_eq!(r.tx.tx_burst(&mut vec![m]), 1);
    let mut seen: Vec<u8> = r.keep_paused(20).into_iter().map(|(_, b)| b).collect();
    assert_eq!(
        seen,
        [2],
        "the priority 0 datagram goes, the priority 3 one waits"
    );
    r.pfc(0);
    let t = Instant::now();
    while !seen.contains(&1) {
        assert!(t.elapsed() < Duration::from_secs(5), "not released by XON");
        seen.extend(r.markers());
        std::thread::sleep(Duration::from_micros(200));
    }
    let c = wait_cq(&mut r.qps[0], 2, 5);
    assert!(c.iter().all(|c| c.status == WcStatus::Success), "{c:?}");
    let s = r.rt.stop();
    assert_eq!(s[0].nic.tx_held, 1);
}

/// A peer that pauses priority 3 forever trips the watchdog: after the detection time the
/// RNIC stops honouring it (forward: the held send goes; drop: its frames are discarded,
/// counted), the other priority keeps running throughout, and the storm ends once the
/// pauses stop for the restoration time.
#[test]
fn the_pfc_watchdog_trips_on_a_peer_that_pauses_forever() {
    for action in [dcb::pfc::StormAction::Forward, dcb::pfc::StormAction::Drop] {
        let w = dataplane::config::PfcWatchdog {
            detect_ms: 60,
            restore_ms: 60,
            action,
        };
        let mut r = PfcRig::new(&format!("pfcwd{}", action as u8), Some(w));
        r.pfc(0xffff);
        let start = Instant::now();
        r.send(0);
        let mut first = None;
        let mut other = 0;
        while start.elapsed() < Duration::from_millis(300) {
            r.send(1);
            for q in r.senders() {
                if q == r.qps[0].qpn && first.is_none() {
                    first = Some(start.elapsed());
                }
                if q == r.qps[1].qpn {
                    other += 1;
                }
            }
            r.pfc(0xffff);
            std::thread::sleep(Duration::from_millis(2));
            let _ = wait_cq(&mut r.qps[1], 1, 0);
        }
        assert!(other > 10, "priority 0 kept running: {other} frames");
        let n = r.rt.stats(0).nic;
        assert_eq!(n.pfc_storms_detected, 1, "{n:?}");
        match action {
            dcb::pfc::StormAction::Forward => {
                let t = first.expect("forwarded once the storm was detected");
                assert!(
                    t >= Duration::from_millis(55),
                    "held until detection: {t:?}"
                );
                assert_eq!(n.tx_storm_dropped, 0);
            }
            dcb::pfc::StormAction::Drop => {
                assert_eq!(first, None, "a stormed priority's frames are dropped");
                assert!(n.tx_storm_dropped >= 1, "{n:?}");
            }
        }
        // No more pauses, only XONs: restored after 60 ms (an XON is no pause; SONiC's
        // watchdog is known to stay stormed when a storm turns to XONs).
        let t = Instant::now();
        while r.rt.stats(0).nic.pfc_storms_restored == 0 {
            assert!(t.elapsed() < Duration::from_secs(5), "never restored");
            r.pfc(0);
            std::thread::sleep(Duration::from_millis(5));
        }
        drop(r.rt.stop());
    }
}

/// B handles at most 20 000 frames/s (`fault.rx_pps`, a host too slow for its link) while A
/// may have 1024 packets in flight: B's backlog builds in its receive buffer, and at the
/// XOFF threshold (128 KiB of mbufs, about 29 frames) B pauses A's priority 3 with PFC,
/// resuming it below XON. The headroom (896 KiB, about 200 frames) holds what A sends
/// before it hears the XOFF, so nothing is discarded and the data arrives whole; without the
/// pauses A's window (1024 frames, 4 MiB of mbufs) would overflow the 1 MiB buffer.
#[test]
fn an_overloaded_receiver_pauses_its_sender_with_pfc() {
    let mk = |host: u8| {
        let mut c = test_config(host, 1024);
        c.pcp = 3;
        c.send_window = 1024;
        // Pause quanta timed at 1 Gb/s: an XOFF holds 33.5 ms, longer than a worker of this
        // loaded 2-core machine may go unscheduled (at 100 Gb/s it held 335 us, and a
        // receiver that missed its refresh let the sender overflow its buffer).
        c.speed_gbps = 1;
        c.pfc = dataplane::config::PfcConfig {
            mode: dcb::pfc::Mode::Pfc { enabled: 1 << 3 },
            watchdog: None,
            rx_buffer: 1 << 20,
            rx_headroom: 896 << 10,
        };
        c
    };
    let mut cb = mk(4);
    cb.fault.rx_pps = 20_000;
    let rt = Runtime::loopback("ferroce-tests", mk(3), cb).expect("loopback");
    let mut a = side(rt.open(0).unwrap(), QpType::Rc, 8 << 20, 256);
    let mut b = side(rt.open(1).unwrap(), QpType::Rc, 8 << 20, 256);
    // A 268 ms ACK timeout: B's backlog (up to ~200 frames at 20 000/s) delays ACKs by
    // 10 ms, and a retransmission here must mean a loss, not an impatient timer.
    connect_pair_with(&mut a, &mut b, Mtu::M1024, (1, 2), QpType::Rc, 16);
    let len = 256 * 1024u32;
    let data = pattern(7, len as usize);
    a.buf.write(0, &data);
    for i in 0..8u64 {
        post_write_at(&mut a, &b, i, 0, len);
    }
    let c = wait_cq(&mut a, 8, 60);
    assert_eq!(c.len(), 8, "{c:?}");
    assert!(c.iter().all(|c| c.status == WcStatus::Success), "{c:?}");
    assert_eq!(b.buf.to_vec(0, len as usize), data);
    let snaps = rt.stop();
    let (na, nb) = (&snaps[0].nic, &snaps[1].nic);
    assert!(nb.tx_pfc >= 2, "B paused and resumed A: {nb:?}");
    assert!(na.rx_pfc >= nb.tx_pfc, "A heard every pause frame: {na:?}");
    assert_eq!(na.rx_pause_ignored, 0, "{na:?}");
    assert_eq!(nb.rx_buffer_discards, 0, "{nb:?}");
    assert!(
        nb.rx_buffer_peak >= 128 << 10,
        "B's buffer reached XOFF: {nb:?}"
    );
    assert_eq!(snaps[0].qps.retransmitted_pkts, 0, "{:?}", snaps[0].qps);
}

/// A peer that floods a UD QP with no receive WQEs fills the UD wait list. The port's other
/// traffic must go on meanwhile (a full list used to stop the receive loop: an RC WRITE then
/// waited for as long as the peer kept the list full), the oldest waiting message making
/// room for a new one, counted; and messages with a Q_Key the QP would refuse take no place
/// in the wait at all.
#[test]
fn a_full_ud_wait_list_holds_back_no_other_traffic() {
    const HOLD: u32 = 32;
    let ca = test_config(3, 4096);
    let mut cb = test_config(4, 4096);
    cb.ud_rx_hold_frames = HOLD;
    cb.ud_rx_hold_us = 60_000_000; // nothing leaves the wait by time during the test
    let (rt, mut a, b) = pair_with(ca, cb, QpType::Rc);
    let mut ua = side(rt.open(0).unwrap(), QpType::Ud, 65536, 256);
    let mut ub = side(rt.open(1).unwrap(), QpType::Ud, 65536, 256);
    connect_pair_with(
        &mut ua,
        &mut ub,
        Mtu::M1024,
        (1, 1),
        QpType::Ud,
        ACK_TIMEOUT,
    );
    // `n` 64-byte UD SENDs to ub's QP (which has no receive WQE) with `qkey`.
    let flood = |ua: &mut Side, qkey: u32, n: u64| {
        let ud = UdDest {
            ah: AddressVector::new(ub.gid, 1),
            remote_qpn: ub.qpn,
            remote_qkey: Qkey(qkey),
        };
        for i in 0..n {
            let wr = SendWr {
                wr_id: i,
                op: WrOp::Send,
                sg_list: &[ua.mr.sge(0, 64)],
                flags: SendFlags::SIGNALED,
                ud: Some(ud),
            };
            ua.ctx.post_send(ua.qpn, &wr).expect("post UD send");
            if i % 64 == 63 {
                assert_eq!(wait_cq(ua, 64, 10).len(), 64, "UD sends");
            }
        }
    };
    let nic = |rt: &Runtime| rt.stats(1).nic;
    // Wrong Q_Key: dropped by the QP at once, none waits.
    flood(&mut ua, 0x2222_2222, 128);
    assert!(
        wait_until(10, || rt.stats(1).qps.rx_dropped_qkey >= 128),
        "{:?}",
        rt.stats(1).qps
    );
    assert_eq!(nic(&rt).rx_ud_held, 0, "a message the QP refuses waited");
    // The right Q_Key, four times what the wait holds.
    flood(&mut ua, 0x1111_1111, 4 * HOLD as u64);
    assert!(
        wait_until(10, || nic(&rt).rx_ud_held >= 4 * HOLD as u64),
        "{:?}",
        nic(&rt)
    );
    assert_eq!(nic(&rt).rx_ud_hold_expired, 3 * HOLD as u64);
    // The RC pair on the same ports goes on while the wait is full.
    let data = pattern(7, 8192);
    a.buf.write(0, &data);
    post_write_at(&mut a, &b, 1, 0, 8192);
    let c = wait_cq(&mut a, 1, 10);
    assert_eq!(
        c.len(),
        1,
        "an RC WRITE waited behind the full UD wait list"
    );
    assert_eq!(c[0].status, WcStatus::Success);
    assert_eq!(b.buf.to_vec(0, 8192), data);
    drop((a, b, ua, ub));
    drop(rt);
}

/// A CQ cannot shrink below the completions it holds, counting those already in the
/// application's ring (rxe_cq_chk_attr: EINVAL); once they are polled it can.
#[test]
fn a_cq_does_not_shrink_below_the_completions_it_holds() {
    let (rt, mut a, mut b) = pair_with(test_config(3, 1024), test_config(4, 1024), QpType::Rc);
    for i in 0..20 {
        post_write_at(&mut a, &b, i, 0, 64);
    }
    // Down to 19 while the 20 completions arrive: refused once all are in. (Polling B's
    // empty CQ drives the worker, as an application's polls do, without taking A's.)
    let mut last = None;
    let mut none = [Completion::default(); 1];
    let refused = wait_until(10, || {
        let _ = b.ctx.poll_cq(b.cq, &mut none);
        let r = a.ctx.resize_cq(a.cq, 19);
        let no = matches!(r, Err(roce::engine::VerbsError::InvalidArgument(_)));
        last = Some(r);
        no
    });
    assert!(refused, "shrunk below 20 unpolled completions: {last:?}");
    assert_eq!(wait_cq(&mut a, 20, 10).len(), 20);
    assert_eq!(a.ctx.resize_cq(a.cq, 5).unwrap(), 5);
    drop((a, b));
    drop(rt);
}

/// A privileged Q_Key (high bit set; QP1's 0x80010000 among them) lets a UD QP speak to
/// other hosts' management QPs: only a privileged client may set one (Linux asks
/// CAP_NET_RAW). A client of another user (as rnicd attaches it, uid 1000) gets EPERM; the
/// same call by root's client, and an ordinary Q_Key by anyone, succeed.
#[test]
fn only_a_privileged_client_sets_a_privileged_qkey() {
    use dataplane::abi::ClientLimits;
    use dataplane::app::Client;
    use roce::engine::{QpInit, VerbsError};
    let rt = Runtime::loopback("ferroce-pqkey", test_config(1, 1024), test_config(2, 1024))
        .expect("runtime");
    for (uid, privileged_ok) in [(1000u32, false), (0, true)] {
        let (rings, chan) = rt
            .attach_host(0, ClientLimits::default(), 1, uid, "pqkey")
            .expect("attach");
        let mut c = Client::attach(chan, rings, rt.host_limits(0));
        let pd = c.alloc_pd().unwrap();
        let cq = c.create_cq(8).unwrap();
        let qpn = c
            .create_qp(&QpInit {
                qp_type: QpType::Ud,
                ..QpInit::rc(pd, cq)
            })
            .unwrap();
        let init = |qkey: u32| QpAttr {
            state: Some(QpState::Init),
            pkey_index: Some(0),
            port: Some(1),
            qkey: Some(Qkey(qkey)),
            ..Default::default()
        };
        let r = c.modify_qp(qpn, &init(0x8001_0000));
        if privileged_ok {
            r.expect("root sets a privileged Q_Key");
        } else {
            assert!(
                matches!(r, Err(VerbsError::PermissionDenied(_))),
                "uid {uid}: {r:?}"
            );
            c.modify_qp(qpn, &init(0x1111_1111))
                .expect("an ordinary Q_Key");
        }
        c.close();
    }
    rt.stop();
}
