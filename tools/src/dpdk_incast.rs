//! `rnic-sim rnics --dpdk K`: the N:1 incast of `rnic-sim rnics` run for real, with ferroce
//! RNICs on DPDK exchanging frames through the emulated switch (`dataplane::switch`) in real
//! time, slowed down K times so two cores keep up.
//!
//! Slowing a scenario down by K divides every rate by K and multiplies every time by K: link
//! rates, DCQCN's rates (line, minimum, additive and hyper increase) and its periods (alpha,
//! rate decrease, increase timer), the CNP interval, the link delay and the run itself. Every
//! byte quantity stays (frame sizes, the switch buffer, XOFF and headroom, ECN's Kmin and
//! Kmax, DCQCN's byte counter), and so does every ratio: the queue in bytes, the share of the
//! bottleneck, fairness and the count of CNPs and pause frames compare directly with the
//! simulated run at the nominal rate. What does not slow down is the software's own time (a
//! worker iteration, the driver's polling), which K makes small beside the scenario's.

use std::time::{Duration, Instant};

use dataplane::runtime::{loopback_raw_config, Runtime};
use dataplane::switch::SwitchSettings;
use dataplane::{Buffer, Context, Mr, Verbs};
use dcb::dcqcn::RpParams;
use dcb::switch::SwitchConfig;
use roce::engine::{CqId, QpInit, VerbsError};
use roce::sim::fabric::IncastOutcome;
use roce::types::{Psn, Qpn};
use roce::verbs::*;

use crate::sim_tool::Preset;

/// Message size: 64 KiB RDMA WRITEs, as in the simulated incast.
const MSG: u32 = 64 * 1024;

/// One incast run on DPDK.
#[derive(Debug, Clone, Copy)]
pub struct DpdkIncast {
    /// Senders (each its own RNIC and switch port; the receiver's port is the last).
    pub senders: usize,
    /// WRITEs each sender keeps outstanding.
    pub depth: u64,
    /// The scenario's link rate, Gb/s, before slowing down.
    pub gbps: f64,
    /// K: rates divided by it, times multiplied.
    pub slowdown: f64,
    /// DCQCN preset (None: PFC only).
    pub preset: Option<Preset>,
    /// The scenario's duration, ns, before slowing down (measured over the last 4/5).
    pub duration_ns: u64,
}

impl DpdkIncast {
    /// The links' real rate, Mb/s.
    pub fn link_mbps(&self) -> f64 {
        self.gbps * 1000.0 / self.slowdown
    }

    /// `p` slowed down K times.
    fn slow(&self, p: RpParams) -> RpParams {
        let k = self.slowdown;
        let t = |ns: u64| (ns as f64 * k).round() as u64;
        RpParams {
            line_rate: p.line_rate / k,
            min_rate: p.min_rate / k,
            ai_rate: p.ai_rate / k,
            hai_rate: p.hai_rate / k,
            rate_on_first_cnp: p.rate_on_first_cnp / k,
            alpha_period: t(p.alpha_period),
            decrease_period: t(p.decrease_period),
            timer: t(p.timer),
            ..p
        }
    }
}

/// One end of an RC connection: its QP and the GID it is reached at.
pub struct End {
    /// The QP.
    pub qpn: Qpn,
    /// Its port's GID.
    pub gid: roce::types::Gid,
}

/// Runs `s`; the outcome's rates are the real (slowed) ones, Gb/s.
pub fn run(s: &DpdkIncast) -> Result<IncastOutcome, String> {
    let n = s.senders;
    if n == 0 || n > 64 {
        return Err(format!("{n} senders: 1..=64"));
    }
    let k = s.slowdown;
    if !(1.0..=1000.0).contains(&k) {
        return Err(format!("slow-down {k}: 1..=1000"));
    }
    let mbps = s.link_mbps();
    if mbps < 1.0 {
        return Err(format!("{mbps} Mb/s links: slowed down too far"));
    }
    let nominal = s.gbps * 1000.0;
    let e = |e: dataplane::config::ConfigError| e.to_string();
    let mut cfgs = Vec::new();
    for host in 1..=n + 1 {
        let mut r = loopback_raw_config(host as u8, 4096);
        // Every QP on the lossless priority 3 (CNPs on 6), PFC honoured and sent on it: the
        // frames are untagged, so the priority is their DSCP's (26 / 8), at the switch as at
        // the RNICs.
        r.set("roce.trust", "dscp").map_err(e)?;
        r.set("roce.dscp", "26").map_err(e)?;
        r.set("pfc.mode", "pfc").map_err(e)?;
        r.set("pfc.priorities", "3").map_err(e)?;
        r.set("worker.idle_sleep_us", "50").map_err(e)?;
        // One pool serves every RNIC and the switch: room for the switch's 8 MiB buffer and
        // every RNIC's rings and bursts.
        r.set("port.mbufs", "16384").map_err(e)?;
        let mut c = r.validate().map_err(|e| e.to_string())?;
        if let Some(p) = s.preset {
            c.ecn = true;
            // The NP interval as in the simulated run: the paper's 50 us, the firmware's 4.
            let np_ns = match p {
                Preset::Paper => 50_000.0,
                Preset::Nvidia => 4_000.0,
            };
            c.dcqcn.rp = Some(s.slow(p.rp(nominal)));
            c.dcqcn.np_min_interval_ns = Some((np_ns * k) as u64);
        }
        cfgs.push(c);
    }
    // The simulated fabric's links are 1 us each way, two per path; here the delay is on
    // the switch's egress, once per path.
    let delay_ns = (2_000.0 * k) as u64;
    let sample_ns = ((s.duration_ns / 1000).clamp(1_000, 100_000) as f64 * k) as u64;
    let settings = SwitchSettings {
        rate_mbps: mbps,
        port_mbps: Vec::new(),
        // The simulated switch's headroom for the same link, plus what an RNIC has handed to
        // its port when the XOFF comes (its 16-frame ring link and a burst of 32).
        headroom: SwitchConfig::headroom_for(mbps, delay_ns, 4096) + 48 * 4200,
        delay_us: (delay_ns / 1000) as u32,
        buffer: 8 << 20,
        red: s.preset.map(|_| dcb::ecn::Red::scaled(s.gbps)),
        pfc: dcb::pfc::Mode::Pfc { enabled: 1 << 3 },
        thresholds: dcb::pfc::Thresholds {
            xoff: 200_000,
            xon: 200_000 - 2 * 4200,
        },
        sample_us: (sample_ns / 1000).max(1) as u32,
        ..Default::default()
    };
    let rt = Runtime::switched("rnic-sim", cfgs, &settings).map_err(|e| e.to_string())?;
    let out = drive(&rt, s, sample_ns);
    let stats = rt.switch_stats(0);
    let snaps = rt.stop();
    let mut out = out?;
    let sw = stats.ok_or("the switch published no counters")?;
    out.drops = sw.model.drops.iter().sum::<u64>() + sw.delay_dropped + sw.nombuf;
    out.xoff = sw.model.pfc_xoff;
    out.peak = sw.model.peak_queue.get(n).copied().unwrap_or(0);
    out.cnps = snaps[..n].iter().map(|s| s.qps.rp_cnp_handled).sum();
    out.kmax = settings.red.map_or(0, |r| r.kmax);
    let lost: u64 = snaps.iter().map(|s| s.nic.rx_buffer_discards).sum();
    out.drops += lost;
    Ok(out)
}

/// A sender: its context, CQ, QP and buffer.
struct Sender {
    ctx: Context,
    cq: CqId,
    qpn: Qpn,
    _buf: Buffer,
    mr: Mr,
}

/// Sets up the QPs, keeps every sender's WRITEs going for the run, and measures.
fn drive(rt: &Runtime, s: &DpdkIncast, sample_ns: u64) -> Result<IncastOutcome, String> {
    let n = s.senders;
    let e = |what: &str, err: VerbsError| format!("{what}: {err}");
    // The receiver: one context, one CQ, one QP and one buffer share per sender.
    let mut rx = rt.open(n).map_err(|e| e.to_string())?;
    let rx_pd = rx.alloc_pd().map_err(|x| e("pd", x))?;
    let rx_cq = rx.create_cq(64).map_err(|x| e("cq", x))?;
    let depth = s.depth.clamp(1, 64);
    // Twice as many message slots as WRITEs outstanding, per sender and in its share of
    // the receiver's buffer.
    let slots = 2 * depth;
    let share = slots * MSG as u64;
    let rx_buf = rx
        .alloc_buffer((share * n as u64) as usize)
        .map_err(|x| e("buffer", x))?;
    let rx_mr = rx
        .reg_mr(rx_pd, &rx_buf, 0, rx_buf.len(), Access::ALL)
        .map_err(|x| e("mr", x))?;
    let rx_gid = rx.query_gid(1).map_err(|x| e("gid", x))?;
    let mut senders = Vec::new();
    let mut rx_qps = Vec::new();
    for i in 0..n {
        let mut ctx = rt.open(i).map_err(|e| e.to_string())?;
        let pd = ctx.alloc_pd().map_err(|x| e("pd", x))?;
        let cq = ctx.create_cq(64).map_err(|x| e("cq", x))?;
        let qpn = ctx
            .create_qp(&rc_qp_init(pd, cq, 64))
            .map_err(|x| e("qp", x))?;
        let buf = ctx
            .alloc_buffer(share as usize)
            .map_err(|x| e("buffer", x))?;
        let mr = ctx
            .reg_mr(pd, &buf, 0, share as usize, Access::ALL)
            .map_err(|x| e("mr", x))?;
        let gid = ctx.query_gid(1).map_err(|x| e("gid", x))?;
        let rq = rx
            .create_qp(&rc_qp_init(rx_pd, rx_cq, 64))
            .map_err(|x| e("qp", x))?;
        let me = End { qpn, gid };
        let peer = End {
            qpn: rq,
            gid: rx_gid,
        };
        connect(&mut ctx, &me, &peer)?;
        connect(&mut rx, &peer, &me)?;
        rx_qps.push(rq);
        senders.push(Sender {
            ctx,
            cq,
            qpn,
            _buf: buf,
            mr,
        });
    }
    let k = s.slowdown;
    let until = Duration::from_nanos((s.duration_ns as f64 * k) as u64);
    let from = until / 5;
    let step = Duration::from_nanos(sample_ns);
    let mut posted = vec![0u64; n];
    let mut seq = vec![0u64; n];
    let mut done = vec![0u64; n];
    let mut measured = vec![0u64; n];
    let mut out = IncastOutcome::default();
    let mut last = (Duration::ZERO, vec![0u64; n]);
    let mut queue: Vec<u64> = Vec::new();
    let mut measuring = false;
    let mut wc = [Completion::default(); 16];
    let start = Instant::now();
    loop {
        let now = start.elapsed();
        if now >= until {
            break;
        }
        if !measuring && now >= from {
            // Queue samples count from here.
            rt.take_switch_samples(0);
            measuring = true;
        }
        let mut progress = false;
        for (i, t) in senders.iter_mut().enumerate() {
            let got = t.ctx.poll_cq(t.cq, &mut wc).map_err(|x| e("poll", x))?;
            for c in &wc[..got] {
                if c.status != WcStatus::Success {
                    return Err(format!("sender {i}: {c:?}"));
                }
                posted[i] -= 1;
                done[i] += MSG as u64;
                if measuring {
                    measured[i] += MSG as u64;
                }
                progress = true;
            }
            while posted[i] < depth {
                let slot = seq[i] % slots;
                let off = slot * MSG as u64;
                let sge = t.mr.sge(off, MSG);
                t.ctx
                    .post_send(
                        t.qpn,
                        &SendWr {
                            wr_id: seq[i],
                            op: WrOp::Write {
                                remote_addr: rx_mr.addr + i as u64 * share + off,
                                rkey: rx_mr.rkey.ok_or("the receiver's MR has no rkey")?,
                            },
                            sg_list: &[sge],
                            flags: SendFlags::SIGNALED,
                            ud: None,
                        },
                    )
                    .map_err(|x| e("post_send", x))?;
                posted[i] += 1;
                seq[i] += 1;
            }
        }
        if now >= last.0 + step {
            let dt = (now - last.0).as_nanos().max(1) as f64;
            let g = (0..n)
                .map(|i| (done[i] - last.1[i]) as f64 * 8.0 / dt)
                .collect();
            let samples = rt.take_switch_samples(0);
            let q = samples.last().map_or(0, |(_, ports)| ports[n]);
            if measuring {
                queue.extend(samples.iter().map(|(_, ports)| ports[n]));
            }
            out.series.push((now.as_nanos() as f64 / 1000.0, g, q));
            last = (now, done.clone());
        }
        if !progress {
            std::thread::sleep(Duration::from_micros(20));
        }
    }
    queue.extend(rt.take_switch_samples(0).iter().map(|(_, ports)| ports[n]));
    if queue.is_empty() {
        return Err("the switch recorded no queue samples".into());
    }
    queue.sort_unstable();
    let secs = (until - from).as_secs_f64();
    out.per_sender = measured
        .iter()
        .map(|b| *b as f64 * 8.0 / secs / 1e9)
        .collect();
    out.p99 = queue.get(queue.len() * 99 / 100).copied().unwrap_or(0);
    Ok(out)
}

/// An RC QP on `pd` with `cq` for both queues, `depth` send WRs, one SGE.
pub fn rc_qp_init(pd: roce::memory::PdId, cq: CqId, depth: u32) -> QpInit {
    QpInit {
        caps: QpCaps {
            max_send_wr: depth,
            max_recv_wr: 1,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        ..QpInit::rc(pd, cq)
    }
}

/// Brings `me` to RTS towards `peer` (PSN 0 both ways, 4 KiB MTU; an ACK timeout of about
/// 1 s, as a slowed-down run stretches the round trip).
pub fn connect(ctx: &mut Context, me: &End, peer: &End) -> Result<(), String> {
    let steps = [
        QpAttr {
            state: Some(QpState::Init),
            pkey_index: Some(0),
            port: Some(1),
            access: Some(Access::ALL),
            ..Default::default()
        },
        QpAttr {
            state: Some(QpState::Rtr),
            av: Some(AddressVector::new(peer.gid, 1)),
            path_mtu: Some(Mtu::M4096),
            dest_qp: Some(peer.qpn),
            rq_psn: Some(Psn::new(0)),
            max_dest_rd_atomic: Some(1),
            min_rnr_timer: Some(1),
            ..Default::default()
        },
        QpAttr::rts(Psn::new(0), 18, 1),
    ];
    for a in &steps {
        ctx.modify_qp(me.qpn, a)
            .map_err(|x| format!("modify_qp {:?}: {x}", a.state))?;
    }
    Ok(())
}
