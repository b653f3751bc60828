//! The host interface (application contexts on a running RNIC): inline data copied at post
//! time, SRQ limits and verbs, routing of events to the context that owns the object,
//! objects of one context unusable by another, resources released when a context or buffer
//! is dropped, and applications that learn of a dead worker instead of hanging.

use std::time::{Duration, Instant};

use dataplane::runtime::{test_config, Runtime};
use dataplane::Verbs;
use ferroce_tests::{connect_pair, loopback_pair, post_recv_one, side, wait_cq, wait_until, Side};
use roce::engine::{QpInit, SrqAttr, VerbsError};
use roce::verbs::*;

fn rc_pair() -> (Runtime, Side, Side) {
    let configs = (test_config(3, 1024), test_config(4, 1024));
    loopback_pair("ferroce-host", configs, QpType::Rc, 1 << 20, (100, 200))
}

/// Posts made inside `Client::batch` reach the worker together when it ends (one ring
/// doorbell for a list of WRs, as ibv_post_send with chained WRs): none completes while the
/// batch lasts, even with the worker running, and all of them complete after it.
#[test]
fn a_batch_of_posts_is_published_at_its_end() {
    let (rt, mut a, b) = rc_pair();
    let (qpn, cq, mr) = (a.qpn, a.cq, a.mr);
    let (raddr, rkey) = (b.mr.addr, b.mr.rkey.unwrap());
    a.buf.write(0, &[7u8; 4096]);
    a.ctx.batch(|c| {
        for i in 0..8u64 {
            let wr = SendWr {
                wr_id: i,
                op: WrOp::Write {
                    remote_addr: raddr + i * 512,
                    rkey,
                },
                sg_list: &[mr.sge(i * 512, 512)],
                flags: SendFlags::SIGNALED,
                ud: None,
            };
            c.post_send(qpn, &wr).expect("post");
        }
        // The worker runs meanwhile (its own thread, and this poll drives it): it has
        // nothing to take.
        let mut wc = [Completion::default(); 8];
        let t = Instant::now();
        while t.elapsed() < Duration::from_millis(50) {
            assert_eq!(c.poll_cq(cq, &mut wc), Ok(0), "a post escaped the batch");
        }
    });
    let c = wait_cq(&mut a, 8, 10);
    assert_eq!(c.len(), 8);
    assert!(c.iter().all(|c| c.status == WcStatus::Success), "{c:?}");
    assert_eq!(b.buf.to_vec(0, 4096), vec![7u8; 4096]);
    drop((a, b));
    rt.stop();
}

/// A batch of more cells than the post ring holds (8192): when the ring fills inside the
/// batch, the client publishes what it staged and waits for the worker to take it, so every
/// post arrives, in order, and none is lost or repeated.
#[test]
fn a_batch_larger_than_the_post_ring_publishes_as_the_ring_fills() {
    const N: u64 = 4096;
    const LEN: u64 = 128; // inline: a head cell and two data cells a post, 12288 cells in all
    let rt = Runtime::loopback(
        "ferroce-bigbatch",
        test_config(3, 1024),
        test_config(4, 1024),
    )
    .expect("loopback");
    let mut a = side(rt.open(0).unwrap(), QpType::Rc, 4096, N as u32);
    let mut b = side(rt.open(1).unwrap(), QpType::Rc, 1 << 20, 16);
    a.qpn = a
        .ctx
        .create_qp(&QpInit {
            pd: a.pd,
            qp_type: QpType::Rc,
            send_cq: a.cq,
            recv_cq: a.cq,
            srq: None,
            caps: QpCaps {
                max_send_wr: N as u32,
                max_recv_wr: 1,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: LEN as u32,
            },
            sq_sig_all: false,
        })
        .expect("qp");
    connect_pair(&mut a, &mut b, Mtu::M1024, (1, 2), QpType::Rc);
    let scratch = a.ctx.alloc_buffer(4096).unwrap();
    let (qpn, raddr, rkey) = (a.qpn, b.mr.addr, b.mr.rkey.unwrap());
    a.ctx.batch(|c| {
        for i in 0..N {
            // Inline bytes are copied at post time: the buffer is reused at once.
            scratch.write(0, &[(i % 251) as u8; LEN as usize]);
            let wr = SendWr {
                wr_id: i,
                op: WrOp::Write {
                    remote_addr: raddr + i * LEN,
                    rkey,
                },
                sg_list: &[Sge {
                    addr: scratch.addr(),
                    length: LEN as u32,
                    lkey: roce::types::Lkey(0),
                }],
                flags: SendFlags::SIGNALED | SendFlags::INLINE,
                ud: None,
            };
            c.post_send(qpn, &wr).expect("post");
        }
    });
    let c = wait_cq(&mut a, N as usize, 60);
    assert_eq!(
        c.iter().map(|c| c.wr_id).collect::<Vec<_>>(),
        (0..N).collect::<Vec<_>>(),
        "every post completed once, in order"
    );
    assert!(c.iter().all(|c| c.status == WcStatus::Success));
    for i in 0..N {
        assert_eq!(
            b.buf.to_vec((i * LEN) as usize, LEN as usize),
            vec![(i % 251) as u8; LEN as usize],
            "WRITE {i}"
        );
    }
    drop((a, b));
    rt.stop();
}

/// IBV_SEND_INLINE lets the application reuse the buffer as soon as post_send returns: the
/// bytes are copied then, from memory that need not be registered. Every message is
/// overwritten right after its post; each must arrive as it was when posted.
#[test]
fn inline_data_is_copied_when_posted() {
    let (rt, mut a, mut b) = rc_pair();
    let scratch = a.ctx.alloc_buffer(4096).unwrap(); // not registered
    const N: u64 = 200;
    for i in 0..N {
        post_recv_one(&mut b, i, i * 64, 64);
    }
    let sge = Sge {
        addr: scratch.addr(),
        length: 64,
        lkey: roce::types::Lkey(0),
    };
    for i in 0..N {
        scratch.write(0, &[i as u8; 64]);
        let wr = SendWr {
            wr_id: i,
            op: WrOp::Send,
            sg_list: &[sge],
            flags: SendFlags::SIGNALED | SendFlags::INLINE,
            ud: None,
        };
        // Alternate the two ways to post inline data: from a buffer, and from a slice.
        if i % 2 == 0 {
            a.ctx.post_send(a.qpn, &wr).unwrap();
        } else {
            let bytes = [i as u8; 64];
            let wr = SendWr { sg_list: &[], ..wr };
            a.ctx.post_send_inline(a.qpn, &wr, &bytes).unwrap();
        }
        scratch.write(0, &[0xee; 64]); // reused at once
    }
    let c = wait_cq(&mut a, N as usize, 20);
    assert!(c.iter().all(|c| c.status == WcStatus::Success), "{c:?}");
    assert_eq!(wait_cq(&mut b, N as usize, 20).len(), N as usize);
    for i in 0..N {
        assert_eq!(
            b.buf.to_vec(i as usize * 64, 64),
            vec![i as u8; 64],
            "message {i}"
        );
    }
    // More than max_inline_data (64 here) is refused at post time.
    let too_big = a.ctx.post_send_inline(
        a.qpn,
        &SendWr {
            wr_id: 0,
            op: WrOp::Send,
            sg_list: &[],
            flags: SendFlags::INLINE,
            ud: None,
        },
        &[0; 65],
    );
    assert!(matches!(too_big, Err(VerbsError::InvalidArgument(_))));
    // Inline SGEs outside this context's buffers are refused, not read.
    let stray = Sge {
        addr: 0x1000,
        length: 8,
        lkey: roce::types::Lkey(0),
    };
    let r = a.ctx.post_send(
        a.qpn,
        &SendWr {
            wr_id: 0,
            op: WrOp::Send,
            sg_list: &[stray],
            flags: SendFlags::INLINE,
            ud: None,
        },
    );
    assert!(matches!(r, Err(VerbsError::InvalidArgument(_))), "{r:?}");
    drop((a, b));
    rt.stop();
}

/// A full SRQ refuses posts synchronously; modify/query/destroy reach the engine; the limit
/// event reaches the context that owns the SRQ; consumed WQEs make room again.
#[test]
fn srq_fullness_limit_and_verbs() {
    let rt = Runtime::loopback("ferroce-host", test_config(3, 1024), test_config(4, 1024))
        .expect("loopback");
    let mut a = side(rt.open(0).unwrap(), QpType::Rc, 1 << 20, 64);
    let mut other = rt.open(1).unwrap(); // a second context on B's RNIC
    let mut b = side(rt.open(1).unwrap(), QpType::Rc, 1 << 20, 64);
    let srq = b
        .ctx
        .create_srq(
            b.pd,
            &SrqAttr {
                max_wr: 4,
                max_sge: 1,
                srq_limit: 0,
            },
        )
        .unwrap();
    let bq = b
        .ctx
        .create_qp(&QpInit {
            pd: b.pd,
            qp_type: QpType::Rc,
            send_cq: b.cq,
            recv_cq: b.cq,
            srq: Some(srq),
            caps: QpCaps {
                max_send_wr: 16,
                max_recv_wr: 0,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            sq_sig_all: false,
        })
        .unwrap();
    b.qpn = bq;
    connect_pair(&mut a, &mut b, Mtu::M1024, (1, 2), QpType::Rc);
    let recv = |b: &mut Side, i: u64| {
        b.ctx.post_srq_recv(
            srq,
            &RecvWr {
                wr_id: i,
                sg_list: &[b.mr.sge(i * 256, 256)],
            },
        )
    };
    for i in 0..4 {
        recv(&mut b, i).unwrap();
    }
    assert_eq!(recv(&mut b, 4), Err(VerbsError::QueueFull));
    // Armed at 3, the limit fires when fewer than 3 WQEs remain: after the second SEND.
    b.ctx.modify_srq(srq, 3).unwrap();
    assert_eq!(b.ctx.query_srq(srq).unwrap().srq_limit, 3);
    assert_eq!(b.ctx.query_srq(srq).unwrap().max_wr, 4);
    assert!(matches!(b.ctx.destroy_srq(srq), Err(VerbsError::Busy(_))));
    for i in 0..2 {
        a.ctx
            .post_send(
                a.qpn,
                &SendWr {
                    wr_id: i,
                    op: WrOp::Send,
                    sg_list: &[a.mr.sge(0, 100)],
                    flags: SendFlags::SIGNALED,
                    ud: None,
                },
            )
            .unwrap();
    }
    assert_eq!(wait_cq(&mut b, 2, 10).len(), 2);
    let mut ev = None;
    wait_until(5, || {
        ev = b.ctx.poll_event();
        ev.is_some()
    });
    assert_eq!(ev, Some(AsyncEvent::SrqLimitReached(srq.0)));
    assert_eq!(
        other.poll_event(),
        None,
        "another context's events stay its own"
    );
    // Two WQEs were consumed: two posts fit again, a third does not.
    assert!(wait_until(5, || recv(&mut b, 10).is_ok()));
    recv(&mut b, 11).unwrap();
    assert_eq!(recv(&mut b, 12), Err(VerbsError::QueueFull));
    // The other context cannot use this one's objects.
    assert!(matches!(other.query_srq(srq), Err(VerbsError::NotFound(_))));
    assert!(matches!(other.query_qp(bq), Err(VerbsError::NotFound(_))));
    assert!(matches!(
        other.modify_qp(
            bq,
            &QpAttr {
                state: Some(QpState::Err),
                ..Default::default()
            }
        ),
        Err(VerbsError::NotFound(_))
    ));
    b.ctx.destroy_qp(bq).unwrap();
    b.ctx.destroy_srq(srq).unwrap();
    // SRQ ids come back (cyclically): a new SRQ under this one's id starts empty, whatever
    // position its predecessor reached (four WQEs fit).
    let attr = SrqAttr {
        max_wr: 4,
        max_sge: 1,
        srq_limit: 0,
    };
    let mut again = None;
    for _ in 0..1000 {
        let s = b.ctx.create_srq(b.pd, &attr).unwrap();
        if s == srq {
            again = Some(s);
            break;
        }
        b.ctx.destroy_srq(s).unwrap();
    }
    let again = again.expect("the id comes back");
    for i in 0..4 {
        recv(&mut b, i).expect("room in a new SRQ");
    }
    b.ctx.destroy_srq(again).unwrap();
    drop((a, b, other));
    rt.stop();
}

/// Dropping a context releases its QPs, CQs, MRs and PDs on the worker and detaches it;
/// dropping the last handle of a buffer forgets its memory.
#[test]
fn dropping_a_context_releases_what_it_created() {
    let rt = Runtime::loopback("ferroce-host", test_config(3, 1024), test_config(4, 1024))
        .expect("loopback");
    let a = side(rt.open(0).unwrap(), QpType::Rc, 1 << 20, 64);
    let extra = {
        let mut c = rt.open(0).unwrap();
        let pd = c.alloc_pd().unwrap();
        let buf = c.alloc_buffer(8192).unwrap();
        c.reg_mr(pd, &buf, 0, 8192, Access::LOCAL_WRITE).unwrap();
        c.create_cq(16).unwrap();
        (c, buf)
    };
    // Counters are published about every millisecond: wait for a snapshot that has every
    // object of both contexts (the CQ rings' areas are counted with their CQs), and take the
    // bytes held from that one.
    let mut snap = rt.stats(0);
    assert!(wait_until(5, || {
        snap = rt.stats(0);
        let o = snap.objects;
        o.qps == 1 && o.mrs == 2 && o.pds == 2 && o.cqs == 2 && snap.hosts == 2
    }));
    // A buffer without an MR is unmapped on the worker once its last handle goes.
    let before = snap.area_bytes;
    let (mut c, buf) = extra;
    let spare = c.alloc_buffer(1 << 20).unwrap();
    c.alloc_pd().unwrap();
    assert!(wait_until(5, || rt.stats(0).area_bytes >= before + (1 << 20)));
    drop(spare);
    c.alloc_pd().unwrap();
    assert!(
        wait_until(5, || rt.stats(0).area_bytes == before),
        "{} bytes held, {before} before the buffer",
        rt.stats(0).area_bytes
    );
    let extra = (c, buf);
    drop(extra);
    drop(a);
    assert!(
        wait_until(5, || {
            let s = rt.stats(0);
            s.objects == Default::default() && s.hosts == 0
        }),
        "{:?}",
        rt.stats(0)
    );
    assert_eq!(rt.stats(0).area_bytes, 0, "rings and buffers unmapped");
    rt.stop();
}

/// Each context gets a bounded event ring; events beyond it are counted, not lost silently.
#[test]
fn events_beyond_the_ring_are_counted() {
    let (rt, mut a, b) = rc_pair();
    let sqd = QpAttr {
        state: Some(QpState::Sqd),
        en_sqd_async_notify: Some(true),
        ..Default::default()
    };
    let rts = QpAttr {
        state: Some(QpState::Rts),
        ..Default::default()
    };
    for _ in 0..1100 {
        a.ctx.modify_qp(a.qpn, &sqd).unwrap();
        a.ctx.modify_qp(a.qpn, &rts).unwrap();
    }
    a.ctx.sync().unwrap();
    let counters = a.ctx.counters(None).unwrap();
    let get = |n: &str| counters.iter().find(|(k, _)| *k == n).unwrap().1;
    let mut got = 0;
    while a.ctx.poll_event().is_some() {
        got += 1;
    }
    assert_eq!(got, 1024, "the ring's worth");
    assert_eq!(get("host_events_dropped"), 1100 - 1024);
    drop((a, b));
    rt.stop();
}

/// A worker that dies (here: a requested panic) does not leave applications waiting: calls
/// fail with DeviceFatal, poll_cq reports it, and poll_event says so once.
#[test]
fn a_dead_worker_fails_calls_instead_of_hanging() {
    let (rt, mut a, b) = rc_pair();
    rt.inject_worker_panic();
    let t = Instant::now();
    assert!(wait_until(10, || matches!(
        a.ctx.alloc_pd(),
        Err(VerbsError::DeviceFatal)
    )));
    assert!(t.elapsed() < Duration::from_secs(10));
    let mut wc = [Completion::default(); 4];
    assert_eq!(a.ctx.poll_cq(a.cq, &mut wc), Err(VerbsError::DeviceFatal));
    let r = a.ctx.post_send(
        a.qpn,
        &SendWr {
            wr_id: 1,
            op: WrOp::Send,
            sg_list: &[a.mr.sge(0, 8)],
            flags: SendFlags::SIGNALED,
            ud: None,
        },
    );
    assert_eq!(r, Err(VerbsError::DeviceFatal));
    let mut evs = Vec::new();
    while let Some(e) = a.ctx.poll_event() {
        evs.push(e);
    }
    assert_eq!(evs, vec![AsyncEvent::DeviceFatal]);
    drop((a, b));
    drop(rt); // joins the dead worker without hanging
}

/// A WR the RNIC would refuse is refused by `post_send` itself (EINVAL, as rdma-core's
/// providers do) and takes no place in the send queue: many more such posts than the queue
/// holds leave it as empty as before, and good WRs go on.
#[test]
fn refused_posts_take_no_send_queue_room() {
    let (rt, mut a, mut b) = rc_pair();
    let rkey = b.mr.rkey.unwrap();
    let bad = [
        // An ATOMIC needs an 8-byte local buffer.
        SendWr {
            wr_id: 1,
            op: WrOp::FetchAdd {
                remote_addr: b.mr.addr,
                rkey,
                add: 1,
            },
            sg_list: &[a.mr.sge(0, 4)],
            flags: SendFlags::SIGNALED,
            ud: None,
        },
        // More inline bytes than the QP takes.
        SendWr {
            wr_id: 2,
            op: WrOp::Send,
            sg_list: &[a.mr.sge(0, 4096)],
            flags: SendFlags::SIGNALED | SendFlags::INLINE,
            ud: None,
        },
    ];
    for i in 0..3 * 256 {
        let e = a.ctx.post_send(a.qpn, &bad[i % 2]).unwrap_err();
        assert!(matches!(e, VerbsError::InvalidArgument(_)), "{e}");
    }
    assert_eq!(a.ctx.sq_room(a.qpn).unwrap(), 256, "no room taken");
    for i in 0..300u64 {
        post_recv_one(&mut b, i, 0, 64);
        a.ctx
            .post_send(
                a.qpn,
                &SendWr {
                    wr_id: 100 + i,
                    op: WrOp::Send,
                    sg_list: &[a.mr.sge(0, 64)],
                    flags: SendFlags::SIGNALED,
                    ud: None,
                },
            )
            .unwrap_or_else(|e| panic!("good post {i}: {e}"));
        let c = wait_cq(&mut a, 1, 10);
        assert_eq!(c[0].status, WcStatus::Success);
    }
    drop((a, b));
    drop(rt);
}

/// Registering memory faults its pages in, as an RNIC pins them at registration: the first
/// RDMA into fresh memory then costs no page fault on the data path.
#[test]
fn registration_faults_the_memory_in() {
    let rt = Runtime::loopback("ferroce-host", test_config(3, 1024), test_config(4, 1024))
        .expect("loopback");
    let mut ctx = rt.open(0).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let len = 4 << 20;
    let buf = ctx.alloc_buffer(len).unwrap();
    let mr = ctx.reg_mr(pd, &buf, 0, len / 2, Access::ALL).unwrap();
    // Faulted in by a helper thread, not the worker: wait for it.
    let resident = || ferroce_host::abi::area::resident_kb(mr.addr).expect("the buffer's mapping");
    wait_until(5, || resident() >= 2048);
    let kb = resident();
    assert!(
        (2048..4096).contains(&kb),
        "the registered half is resident, not all of it: {kb} kB"
    );
    drop(ctx);
    rt.stop();
}
