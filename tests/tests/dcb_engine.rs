//! The fabric simulator's light flow model (dcb::sim: endless MTU packets, no transport),
//! checked against roce's real engines at small N: the same scenario - N senders with RC QPs
//! streaming RDMA WRITEs through one switch port to one receiver, DCQCN pacing each sender,
//! ECN marking at the switch, CNPs from the receiver's notification point - run with the
//! engines' real frames, ACKs and windows. Fairness, utilisation, the queue and the CNP count
//! must agree with the light model's within stated margins.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use dcb::dcqcn::{Np, Rp, RpParams};
use dcb::ecn::{codepoint, Marker, Red};
use dcb::limiter::Pacer;
use dcb::sim::{Config, FlowSpec, Sim};
use roce::engine::{Device, DeviceConfig, Transmit};
use roce::sim::{bring_up, endpoint, node_gid, ConnectOpts, Endpoint};
use roce::types::Gid;
use roce::verbs::{Mtu, SendFlags, SendWr, WrOp};

const LINK_MBPS: f64 = 40_000.0;
const DELAY: u64 = 1_000;
const MSG: u32 = 64 * 1024;

struct Sender {
    dev: Device,
    mac: [u8; 6],
    ep: Endpoint,
    rp: Rp,
    pacer: Pacer,
    busy_until: u64,
    ident: u16,
    posted: u64,
    completed: u64,
    raddr: u64,
    rkey: roce::types::Rkey,
}

#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    /// A data frame of flow `0` reaches the switch.
    ToSwitch(usize, Vec<u8>),
    /// A frame reaches the receiver (flow, CE).
    ToReceiver(usize, bool, Vec<u8>),
    /// A frame (an ACK) reaches sender `0`.
    ToSender(usize, Vec<u8>),
    /// A CNP reaches sender `0`.
    Cnp(usize),
}

fn ser(bytes: usize) -> u64 {
    ((bytes as f64 * 8_000.0) / LINK_MBPS).ceil() as u64
}

/// Sets CE in an IPv4 frame's ECN field and fixes the header checksum (the ICRC masks the
/// ToS byte, so it stays valid).
fn mark_ce(frame: &mut [u8]) {
    frame[15] |= 3;
    frame[24] = 0;
    frame[25] = 0;
    let mut sum = 0u32;
    for i in (14..34).step_by(2) {
        sum += u16::from_be_bytes([frame[i], frame[i + 1]]) as u32;
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    let c = !(sum as u16);
    frame[24..26].copy_from_slice(&c.to_be_bytes());
}

struct Result {
    goodput_gbps: Vec<f64>,
    mean_queue: f64,
    cnps: u64,
}

/// N real RC senders into one receiver through a marking switch port, for `duration` ns;
/// goodput averaged over the second half.
fn real_engines(n: usize, params: RpParams, red: Red, cnp_interval: u64, duration: u64) -> Result {
    let o = ConnectOpts {
        mtu: Mtu::M1024,
        mem_len: 1 << 20,
        depth: 64,
        ..Default::default()
    };
    let rcv_gid = Gid::from_ipv4([10, 99, 0, 100]);
    let mut rcv = Device::new(DeviceConfig {
        gids: vec![rcv_gid],
        ..Default::default()
    });
    let rcv_mac = [2, 0, 0, 0x99, 0, 100];
    let mut senders = Vec::new();
    let mut rcv_eps = Vec::new();
    for i in 0..n {
        let mut dev = Device::new(DeviceConfig {
            gids: vec![node_gid(i)],
            ..Default::default()
        });
        let ep = endpoint(&mut dev, &o, 0x10_0000);
        let rep = endpoint(&mut rcv, &o, 0x100_0000 * (i as u64 + 1));
        bring_up(&mut dev, &ep, rep.qpn, rcv_gid, &o, 100, 200);
        bring_up(&mut rcv, &rep, ep.qpn, node_gid(i), &o, 200, 100);
        senders.push(Sender {
            dev,
            mac: [2, 0, 0, 0x99, 0, i as u8 + 1],
            ep,
            rp: Rp::new(params, 0),
            pacer: Pacer::new(LINK_MBPS, 1086),
            busy_until: 0,
            ident: 0,
            posted: 0,
            completed: 0,
            raddr: rep.addr,
            rkey: rep.rkey,
        });
        rcv_eps.push(rep);
    }
    let mut marker = Marker::new(red, 1);
    let mut nps = vec![Np::default(); n];
    let mut events: BinaryHeap<Reverse<(u64, u64, Ev)>> = BinaryHeap::new();
    let mut seq = 0u64;
    let mut push = |events: &mut BinaryHeap<Reverse<(u64, u64, Ev)>>, t: u64, e: Ev| {
        seq += 1;
        events.push(Reverse((t, seq, e)));
    };
    // The switch port: FIFO of (flow, frame).
    let mut queue: std::collections::VecDeque<(usize, Vec<u8>)> = Default::default();
    let mut queued = 0u64;
    let mut port_busy = 0u64;
    let mut tx = Transmit::default();
    let mut buf = vec![0u8; 9216];
    let mut delivered = vec![0u64; n];
    let mut cnps = 0u64;
    let (mut qsum, mut qn) = (0f64, 0u64);
    let half = duration / 2;
    let mut now = 0u64;
    let mut rcv_ident = 0u16;
    while now <= duration {
        // Keep every sender's send queue full of 64 KiB WRITEs.
        for s in senders.iter_mut() {
            while let Some(c) = s.dev.poll_completion(s.ep.cq) {
                assert_eq!(c.status, roce::verbs::WcStatus::Success, "{c:?}");
                s.completed += 1;
            }
            while s.posted - s.completed < 16 {
                let wr = SendWr {
                    wr_id: s.posted,
                    op: WrOp::Write {
                        remote_addr: s.raddr,
                        rkey: s.rkey,
                    },
                    sg_list: &[s.ep.sge(0, MSG)],
                    flags: SendFlags::SIGNALED,
                    ud: None,
                };
                s.dev.post_send(s.ep.qpn, &wr).expect("post WRITE");
                s.posted += 1;
            }
        }
        // Senders transmit when their link is free and their pacer allows.
        for (i, s) in senders.iter_mut().enumerate() {
            if s.rp.poll_timeout() <= now {
                s.rp.handle_timeout(now);
            }
            if (s.rp.rate() - s.pacer.rate()).abs() > 1e-9 {
                s.pacer.set_rate(now, s.rp.rate(), 1086);
            }
            if s.busy_until > now || s.pacer.next_allowed(now) > now {
                continue;
            }
            if !s.dev.poll_transmit(now, &mut tx) {
                continue;
            }
            s.ident = s.ident.wrapping_add(1);
            let len = s
                .dev
                .write_frame(&tx, s.mac, rcv_mac, None, s.ident, &mut buf)
                .expect("frame");
            s.pacer.on_send(now, len as u64);
            s.rp.on_sent(len as u64, now);
            s.busy_until = now + ser(len);
            push(
                &mut events,
                s.busy_until + DELAY,
                Ev::ToSwitch(i, buf[..len].to_vec()),
            );
        }
        // The switch port transmits, marking at dequeue on the bytes queued.
        if port_busy <= now {
            if let Some((flow, mut frame)) = queue.pop_front() {
                let ce = marker.mark(codepoint::ECT0, queued) == codepoint::CE;
                queued -= frame.len() as u64;
                if ce {
                    mark_ce(&mut frame);
                }
                port_busy = now + ser(frame.len());
                push(
                    &mut events,
                    port_busy + DELAY,
                    Ev::ToReceiver(flow, ce, frame),
                );
            }
        }
        // The receiver's ACKs go back uncongested.
        while rcv.poll_transmit(now, &mut tx) {
            let to = (0..n)
                .find(|i| tx.path.dgid == node_gid(*i))
                .expect("a sender");
            rcv_ident = rcv_ident.wrapping_add(1);
            let len = rcv
                .write_frame(&tx, rcv_mac, senders[to].mac, None, rcv_ident, &mut buf)
                .expect("frame");
            push(
                &mut events,
                now + ser(len) + DELAY,
                Ev::ToSender(to, buf[..len].to_vec()),
            );
        }
        // Timers of the engines.
        for s in senders.iter_mut() {
            if s.dev.poll_timeout().is_some_and(|t| t <= now) {
                s.dev.handle_timeout(now);
            }
        }
        if rcv.poll_timeout().is_some_and(|t| t <= now) {
            rcv.handle_timeout(now);
        }
        // Events due now.
        while events.peek().is_some_and(|Reverse((t, _, _))| *t <= now) {
            let Reverse((_, _, e)) = events.pop().unwrap();
            match e {
                Ev::ToSwitch(flow, frame) => {
                    queued += frame.len() as u64;
                    queue.push_back((flow, frame));
                }
                Ev::ToReceiver(flow, ce, frame) => {
                    if now >= half {
                        delivered[flow] += frame.len().saturating_sub(62) as u64;
                    }
                    rcv.handle_frame(now, &frame);
                    if ce && nps[flow].on_ce(now, cnp_interval) {
                        cnps += 1;
                        push(&mut events, now + 2 * DELAY, Ev::Cnp(flow));
                    }
                }
                Ev::ToSender(i, frame) => senders[i].dev.handle_frame(now, &frame),
                Ev::Cnp(i) => {
                    let s = &mut senders[i];
                    if s.rp.poll_timeout() <= now {
                        s.rp.handle_timeout(now);
                    }
                    s.rp.on_cnp(now);
                }
            }
        }
        if now >= half && now.is_multiple_of(1_000) {
            qsum += queued as f64;
            qn += 1;
        }
        // Step: 25 ns (a 1 KB frame is 217 ns at 40 Gb/s).
        now += 25;
    }
    let secs = (duration - half) as f64 / 1e9;
    Result {
        goodput_gbps: delivered
            .iter()
            .map(|b| *b as f64 * 8.0 / secs / 1e9)
            .collect(),
        mean_queue: qsum / qn.max(1) as f64,
        cnps,
    }
}

#[test]
fn the_light_model_agrees_with_real_engines_at_small_n() {
    let n = 2;
    let params = RpParams::paper(LINK_MBPS);
    let red = Red::PAPER;
    let duration = 40_000_000;
    let real = real_engines(n, params, red, 50_000, duration);
    let light = Sim::new(Config {
        senders: n,
        receivers: 1,
        flows: (0..n)
            .map(|s| FlowSpec {
                src: s,
                dst: 0,
                start: 0,
            })
            .collect(),
        link_mbps: LINK_MBPS,
        link_delay: DELAY,
        mtu: 1024,
        dcqcn: Some(params),
        cnp_interval: 50_000,
        red: Some(red),
        pfc: false,
        pfc_xoff: u64::MAX / 8,
        buffer: 64 << 20,
        sample: 10_000,
        seed: 1,
    })
    .run(duration);
    let lg: Vec<f64> = (0..n).map(|f| light.mean_goodput(f, 20_000.0)).collect();
    let lq = {
        let v: Vec<f64> = light
            .switch
            .iter()
            .filter(|s| s.time_us >= 20_000.0)
            .map(|s| s.queue_bytes as f64)
            .collect();
        v.iter().sum::<f64>() / v.len() as f64
    };
    let (rsum, lsum): (f64, f64) = (real.goodput_gbps.iter().sum(), lg.iter().sum());
    eprintln!(
        "real engines: goodput {:?} Gb/s (Jain {:.3}), queue {:.1} KB, {} CNPs; light model: \
         goodput {lg:?} Gb/s (Jain {:.3}), queue {:.1} KB, {} CNPs",
        real.goodput_gbps,
        dcb::sim::jain_index(&real.goodput_gbps),
        real.mean_queue / 1000.0,
        real.cnps,
        dcb::sim::jain_index(&lg),
        lq / 1000.0,
        light.cnps
    );
    assert!(dcb::sim::jain_index(&real.goodput_gbps) >= 0.95 && dcb::sim::jain_index(&lg) >= 0.95);
    assert!(
        (rsum - lsum).abs() / lsum < 0.10,
        "utilisation: {rsum} vs {lsum}"
    );
    assert!(real.mean_queue < red.kmax as f64 && lq < red.kmax as f64);
    let ratio = real.cnps as f64 / light.cnps.max(1) as f64;
    assert!(
        (0.33..=3.0).contains(&ratio),
        "CNPs: {} vs {}",
        real.cnps,
        light.cnps
    );
}
