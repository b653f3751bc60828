//! The dataplane's receive path as a port delivers it: an RNIC (`dataplane::nic::Nic`) on one
//! end of a DPDK ring link, with RC, UC and UD QPs of an attached client (the same client
//! library and host interface as an application's) connected to a peer that this harness
//! plays on the link's other end. Frames go in through the port's queue, so everything in
//! front of the engine runs as in rnicd: the port's receive buffer, PFC and PAUSE frames,
//! VLAN tags, Ethernet/IPv4/IPv6/UDP classification, ARP and neighbour discovery, the UD
//! hold list, then the engine and the client's memory; the RNIC's answers come back out of
//! the port. Frames are raw bytes; raw bytes re-emitted with valid lengths, checksums and
//! ICRC; RoCE frames built around the QPs' real numbers, keys, addresses and PSNs (over IPv4,
//! sometimes in a VLAN tag, sometimes over IPv6); PFC and PAUSE frames; ARP from any sender.
//! The input also posts work requests and moves the RNIC's clock.
//!
//! Invariants checked:
//! - nothing panics (debug assertions included);
//! - no byte of the client's memory outside a registration is written: the MR covers the
//!   middle page of three whose outer pages keep their canary bytes (IBA C9-26);
//! - every frame the RNIC sends carries its own MAC as source (nothing is reflected or
//!   spoofed), and it sends at most a bounded number per frame received (no amplification);
//! - once the input is done and the clock has run on, every send WR posted has completed
//!   (retry counts are finite), and the pool's mbufs are back at their level before the
//!   input: nothing received or sent is leaked or held for ever.
//!
//! The RNIC, its port and the client are made once per process (DPDK's EAL cannot be
//! started twice); each input starts by bringing every QP back up from RESET with fresh
//! receives, so that inputs start from the same transport state.

use std::cell::RefCell;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use dataplane::abi::area::Area;
use dataplane::abi::{ClientLimits, Command, ReplyData};
use dataplane::app::{Channel, Client};
use dataplane::nic::Nic;
use dataplane::runtime::Runtime;
use dataplane::{Buffer, Mr, Verbs};
use roce::engine::transmit::Transmit;
use roce::engine::{CqId, QpInit, VerbsResult};
use roce::types::{Gid, Psn, Qkey, Qpn, Rkey};
use roce::verbs::*;
use roce::wire::bth::BthRepr;
use roce::wire::ethernet::VlanTag;
use roce::wire::frame::{self, TransportRepr};
use roce::wire::opcode::Opcode;
use smoltcp::wire::{
    ArpOperation, ArpPacket, ArpRepr, EthernetAddress, EthernetFrame, EthernetProtocol, Ipv4Address,
};

use crate::neighbor::ethernet;
use crate::{Input, CANARY, MS, PAGE, QKEY, SEC};

/// Steps of one input at most.
const MAX_STEPS: usize = 64;
/// The peer this harness plays: its MAC and IPv4 address (the RNIC is 10.99.0.1).
const PEER_MAC: [u8; 6] = [0x02, 0, 0, 0x99, 0, 0x02];
const PEER_IP: [u8; 4] = [10, 99, 0, 2];
/// The peer's QP numbers (RC, UC, UD) and its starting PSNs (it sends from PEER_PSN, the
/// RNIC's QPs from OUR_PSN).
const PEER_QPN: [u32; 3] = [0x100, 0x101, 0x102];
const PEER_PSN: u32 = 0x1000;
const OUR_PSN: u32 = 0x2000;
/// Frames the RNIC may send per frame it received plus one per millisecond of clock moved
/// (ACKs, NAKs, READ responses of at most a few packets each here, retransmissions, ARP,
/// PFC): far above what any input legitimately causes, far below a loop.
const SENT_PER_RECEIVED: u64 = 64;

/// A control channel to the RNIC held by this harness: the call runs on it at once.
struct Direct {
    nic: Arc<Mutex<Nic>>,
    token: u64,
}

impl Channel for Direct {
    fn exchange(
        &mut self,
        cmd: Command,
        area: Option<Arc<Area>>,
        _deadline: Option<Instant>,
    ) -> VerbsResult<ReplyData> {
        let mut nic = self.nic.lock().unwrap_or_else(|p| p.into_inner());
        nic.call(self.token, cmd, area)
    }

    fn alive(&self) -> bool {
        true
    }
}

struct World {
    nic: Arc<Mutex<Nic>>,
    rx: pmd_bindings::RxQueue,
    tx: pmd_bindings::TxQueue,
    pool: Arc<pmd_bindings::Mempool>,
    ctx: Client<Direct>,
    pd: roce::memory::PdId,
    cq: CqId,
    qps: [Qpn; 3],
    /// Three pages; the MR covers the middle one.
    buf: Buffer,
    mr: Mr,
    mac: [u8; 6],
    gid: Gid,
    peer_gid: Gid,
    now: u64,
    opcodes: Vec<u8>,
    /// The RNIC's limits (for attaching the untrusted clients of `run_calls`).
    limits: dataplane::abi::HostLimits,
    /// Send WRs posted and completed in this input; frames in and out.
    posted: u64,
    completed: u64,
    received: u64,
    sent: u64,
}

thread_local! {
    static WORLD: RefCell<Option<World>> = const { RefCell::new(None) };
}

impl World {
    fn new() -> World {
        let cfg = dataplane::runtime::test_config(1, 1024);
        dataplane::runtime::init_eal("ferroce-fuzz", &cfg).expect("EAL");
        let pool = Runtime::pool(&cfg).expect("pool");
        // One link per World: the smoke tests make one per thread.
        static LINKS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = LINKS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("fuzznic{}_{n}", std::process::id() % 100_000);
        let (p_rnic, p_raw) =
            pmd_bindings::ring_pair(&name, &Runtime::port_config(&cfg), pool.clone())
                .expect("ring link");
        let nic = Nic::new(cfg, p_rnic, pool.clone()).expect("RNIC");
        let mac = nic.mac();
        let rx = p_raw.rx_queue(0).expect("rx queue");
        let tx = p_raw.tx_queue(0).expect("tx queue");
        std::mem::forget(p_raw); // the queues keep the port
        let limits = nic.host_limits();
        let (rings, host) =
            dataplane::host::host_end(limits, ClientLimits::default(), "fuzz").expect("rings");
        let token = host.token;
        let nic = Arc::new(Mutex::new(nic));
        assert!(nic.lock().unwrap().add_host(host));
        let mut ctx = Client::attach(
            Direct {
                nic: nic.clone(),
                token,
            },
            rings,
            limits,
        );
        let pd = ctx.alloc_pd().expect("pd");
        let cq = ctx.create_cq(256).expect("cq");
        let caps = QpCaps {
            max_send_wr: 32,
            max_recv_wr: 32,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let qps = [QpType::Rc, QpType::Uc, QpType::Ud].map(|qp_type| {
            ctx.create_qp(&QpInit {
                pd,
                qp_type,
                send_cq: cq,
                recv_cq: cq,
                srq: None,
                caps,
                sq_sig_all: false,
            })
            .expect("qp")
        });
        let buf = ctx.alloc_buffer(3 * PAGE).expect("buffer");
        buf.write(0, &[CANARY; 3 * PAGE]);
        let mr = ctx
            .reg_mr(pd, &buf, PAGE, PAGE, Access::ALL)
            .expect("guarded MR");
        let gid = ctx.query_gid(1).expect("gid 1");
        let mut peer = gid.0;
        peer[12..].copy_from_slice(&PEER_IP);
        let mut w = World {
            nic,
            rx,
            tx,
            pool,
            ctx,
            pd,
            cq,
            limits,
            qps,
            buf,
            mr,
            mac,
            gid,
            peer_gid: Gid(peer),
            now: SEC,
            opcodes: (0..=255u8)
                .filter(|&o| Opcode(o).info().is_some())
                .collect(),
            posted: 0,
            completed: 0,
            received: 0,
            sent: 0,
        };
        // The peer's MAC learnt once, as from its ARP reply.
        w.poll(10);
        w
    }

    /// Brings `qpn`, a QP in RESET of transport `t` (0 RC, 1 UC, 2 UD), to RTS: RC/UC towards
    /// the peer's QP of that transport, UD with the peer's Q_Key.
    fn bring_up(&mut self, qpn: Qpn, t: usize) {
        let ud = t == 2;
        let init = QpAttr {
            state: Some(QpState::Init),
            pkey_index: Some(0),
            port: Some(1),
            qkey: ud.then_some(Qkey(QKEY)),
            access: (!ud).then_some(Access::ALL),
            ..Default::default()
        };
        self.ctx.modify_qp(qpn, &init).expect("INIT");
        let rtr = QpAttr {
            state: Some(QpState::Rtr),
            av: (!ud).then(|| AddressVector::new(self.peer_gid, 1)),
            path_mtu: (!ud).then_some(Mtu::M1024),
            dest_qp: (!ud).then(|| Qpn::new(PEER_QPN[t])),
            rq_psn: (!ud).then(|| Psn::new(PEER_PSN)),
            max_dest_rd_atomic: (t == 0).then_some(4),
            min_rnr_timer: (t == 0).then_some(1),
            ..Default::default()
        };
        self.ctx.modify_qp(qpn, &rtr).expect("RTR");
        let rts = QpAttr {
            state: Some(QpState::Rts),
            sq_psn: Some(Psn::new(OUR_PSN)),
            // Finite retries (7 RNR retries would be for ever): every WR ends.
            timeout: (t == 0).then_some(10),
            retry_cnt: (t == 0).then_some(2),
            rnr_retry: (t == 0).then_some(2),
            max_rd_atomic: (t == 0).then_some(4),
            ..Default::default()
        };
        self.ctx.modify_qp(qpn, &rts).expect("RTS");
    }

    /// Where UD SENDs to the peer go.
    fn peer_ud(&self) -> UdDest {
        UdDest {
            ah: AddressVector::new(self.peer_gid, 0),
            remote_qpn: Qpn::new(PEER_QPN[2]),
            remote_qkey: Qkey(QKEY),
        }
    }

    /// Brings every QP back up from RESET (RC/UC towards the peer's QPs, UD with its Q_Key)
    /// with four receives each, the completions of the previous input drained.
    fn reset(&mut self) {
        for (t, qpn) in self.qps.into_iter().enumerate() {
            let reset = QpAttr {
                state: Some(QpState::Reset),
                ..Default::default()
            };
            let _ = self.ctx.modify_qp(qpn, &reset);
            self.bring_up(qpn, t);
            for i in 0..4u64 {
                let wr = RecvWr {
                    wr_id: 0,
                    sg_list: &[self.mr.sge(i * 1024, 1024)],
                };
                self.ctx.post_recv(qpn, &wr).expect("receive");
            }
        }
        self.poll(1);
        self.drain_cq();
        self.posted = 0;
        self.completed = 0;
        self.received = 0;
        self.sent = 0;
    }

    /// Runs the RNIC `iterations` times at the current clock and takes what it sent.
    fn poll(&mut self, iterations: usize) {
        for _ in 0..iterations {
            self.nic.lock().unwrap().poll(self.now);
            self.take_sent();
        }
    }

    /// Takes the frames the RNIC sent: each from its own MAC; ARP requests for the peer
    /// answered as the peer.
    fn take_sent(&mut self) {
        let mut burst = Vec::with_capacity(32);
        loop {
            self.rx.rx_burst(&mut burst);
            if burst.is_empty() {
                break;
            }
            for m in burst.drain(..) {
                let f = m.to_vec();
                drop(m);
                self.sent += 1;
                assert!(f.len() >= 14, "a runt frame sent: {f:?}");
                assert_eq!(
                    f[6..12],
                    self.mac,
                    "a frame sent from another MAC: {f:02x?}"
                );
                if let Some(reply) = arp_reply_for_peer(&f) {
                    self.inject(&reply);
                }
            }
        }
    }

    /// Puts a frame on the link towards the RNIC.
    fn inject(&mut self, f: &[u8]) {
        if f.is_empty() || f.len() > 9000 {
            return;
        }
        let Ok(mut m) = self.pool.alloc() else {
            return;
        };
        if m.append(f.len()).map(|d| d.copy_from_slice(f)).is_none() {
            return;
        }
        let mut out = vec![m];
        self.tx.tx_burst(&mut out);
        self.received += 1;
    }

    fn drain_cq(&mut self) {
        let mut out = [Completion::default(); 16];
        loop {
            let n = self.ctx.poll_cq(self.cq, &mut out).unwrap_or(0);
            self.completed += out[..n].iter().filter(|c| c.wr_id == 1).count() as u64;
            if n < out.len() {
                break;
            }
        }
    }

    /// A RoCE frame from the peer carrying `tr` and `payload`, over IPv4 (or IPv6 between
    /// the IPv6 forms of the same addresses when `v6`), in a VLAN tag when `vlan`.
    fn roce_frame(
        &self,
        tr: TransportRepr,
        payload: &[u8],
        v6: bool,
        vlan: Option<VlanTag>,
    ) -> Vec<u8> {
        let mut tx = Transmit {
            transport: tr,
            ..Default::default()
        };
        tx.path.sgid = self.peer_gid;
        tx.path.dgid = self.gid;
        tx.path.hop_limit = 64;
        if v6 {
            // Link-local forms: not IPv4-mapped, so the frame is IPv6.
            tx.path.sgid.0[..12].copy_from_slice(&[0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
            tx.path.dgid.0[..12].copy_from_slice(&[0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        }
        let repr = tx.frame_repr(PEER_MAC, self.mac, vlan, 1);
        let Ok(len) = repr.frame_len(payload.len()) else {
            return Vec::new();
        };
        let mut buf = vec![0u8; len];
        if repr.emit(&mut buf, payload).is_err() {
            return Vec::new();
        }
        buf
    }

    /// Transport headers from the input around the RNIC's real QPs, keys and PSNs.
    fn structured(&mut self, inp: &mut Input) -> Vec<u8> {
        let qps = self.qps;
        let tr = crate::transport_from_input(inp, &self.opcodes, |inp, t, opcode| {
            let qpn = match t % 6 {
                0..=2 => qps[(t % 3) as usize],
                3 => Qpn::new(1),
                4 => Qpn::new(0),
                _ => Qpn::new(inp.u32() & 0x00ff_ffff),
            };
            let request = opcode.info().is_none_or(|i| i.is_request);
            (qpn, if request { PEER_PSN } else { OUR_PSN })
        });
        let Some(mut tr) = tr else {
            return Vec::new();
        };
        let sel = inp.u8();
        let off = inp.u16() as u64 % (2 * PAGE as u64);
        let rkey = match sel % 4 {
            0 | 1 => self.mr.rkey.unwrap_or(Rkey(0)),
            2 => Rkey(self.mr.rkey.map_or(0, |k| k.0) ^ (inp.u8() as u32)),
            _ => Rkey(inp.u32()),
        };
        // Addresses around the MR: from a page before it to its end and past.
        let addr = (self.mr.addr + off).wrapping_sub(PAGE as u64 / 2);
        if let Some(r) = tr.ext.reth.as_mut() {
            r.va = addr;
            r.rkey = rkey;
            if sel & 4 != 0 {
                r.len %= 2 * PAGE as u32;
            }
        }
        if let Some(a) = tr.ext.atomic_eth.as_mut() {
            a.va = addr & !7;
            a.rkey = rkey;
        }
        if let Some(d) = tr.ext.deth.as_mut() {
            if sel & 8 == 0 {
                d.qkey = Qkey(QKEY);
            }
            d.src_qp = Qpn::new(PEER_QPN[2]);
        }
        let len = inp.u16() as usize % 1100;
        let fill = inp.u8();
        tr.bth.pad_count = ((4 - len % 4) % 4) as u8;
        let v6 = sel & 16 != 0 && sel & 32 != 0;
        let vlan = (sel & 64 != 0).then(|| VlanTag {
            pcp: inp.u8() & 7,
            dei: false,
            vid: inp.u16() & 0xfff,
        });
        self.roce_frame(tr, &vec![fill; len], v6, vlan)
    }

    /// A work request from the input on one of the QPs, towards the peer.
    fn post_send(&mut self, inp: &mut Input) {
        let t = (inp.u8() % 3) as usize;
        let op = match inp.u8() % 6 {
            0 => WrOp::Send,
            1 => WrOp::SendWithImm { imm: inp.u32() },
            2 => WrOp::Write {
                remote_addr: 0x10_0000,
                rkey: Rkey(0x1234),
            },
            3 => WrOp::Read {
                remote_addr: 0x10_0000,
                rkey: Rkey(0x1234),
            },
            4 => WrOp::FetchAdd {
                remote_addr: 0x10_0000,
                rkey: Rkey(0x1234),
                add: 1,
            },
            _ => WrOp::CompareSwap {
                remote_addr: 0x10_0000,
                rkey: Rkey(0x1234),
                compare: 0,
                swap: 1,
            },
        };
        let len = match op {
            WrOp::FetchAdd { .. } | WrOp::CompareSwap { .. } => 8,
            _ => inp.u16() as u32 % 3000,
        };
        let off = (inp.u16() as u64 % PAGE as u64) & !7;
        let len = len.min((PAGE as u64 - off) as u32);
        let ud = (t == 2).then(|| self.peer_ud());
        let wr = SendWr {
            wr_id: 1,
            op,
            sg_list: &[self.mr.sge(off, len)],
            flags: SendFlags::SIGNALED,
            ud,
        };
        if self.ctx.post_send(self.qps[t], &wr).is_ok() {
            self.posted += 1;
        }
    }

    /// One step of the input: a frame, a post, or time.
    fn step(&mut self, inp: &mut Input) {
        match inp.u8() % 10 {
            0 => {
                let n = inp.u16() as usize % 2048;
                let f = inp.bytes(n).to_vec();
                self.inject(&f);
            }
            1 => {
                // Re-emitted: valid lengths, IP checksum and ICRC around the input's headers.
                let n = inp.u16() as usize % 2048;
                let raw = inp.bytes(n);
                if let Ok(p) = frame::inspect(raw) {
                    let mut out = vec![0u8; p.frame_len];
                    if p.repr.emit(&mut out, p.payload(raw)).is_ok() {
                        self.inject(&out);
                    }
                }
            }
            2..=4 => {
                let f = self.structured(inp);
                self.inject(&f);
            }
            5 => {
                let f = mac_control(inp, self.mac);
                self.inject(&f);
            }
            6 => {
                let f = arp(inp, self.mac);
                self.inject(&f);
            }
            7 => self.post_send(inp),
            _ => {
                self.now += inp.u16() as u64 * 10_000;
            }
        }
        self.poll(2);
        self.drain_cq();
    }
}

/// A PFC (802.1Qbb) or PAUSE (802.3x) frame from the peer with times from the input.
fn mac_control(inp: &mut Input, to: [u8; 6]) -> Vec<u8> {
    let dst = if inp.u8() & 1 == 0 {
        [0x01, 0x80, 0xc2, 0, 0, 0x01]
    } else {
        to
    };
    let mut f = Vec::with_capacity(60);
    f.extend_from_slice(&dst);
    f.extend_from_slice(&PEER_MAC);
    f.extend_from_slice(&0x8808u16.to_be_bytes());
    if inp.u8() & 1 == 0 {
        f.extend_from_slice(&0x0101u16.to_be_bytes());
        f.extend_from_slice(&(inp.u8() as u16).to_be_bytes());
        for _ in 0..8 {
            f.extend_from_slice(&inp.u16().to_be_bytes());
        }
    } else {
        f.extend_from_slice(&0x0001u16.to_be_bytes());
        f.extend_from_slice(&inp.u16().to_be_bytes());
    }
    f.resize(60, 0);
    f
}

/// An ARP request or reply from the input: from the peer or anyone, about any address.
fn arp(inp: &mut Input, to: [u8; 6]) -> Vec<u8> {
    let sel = inp.u8();
    let src = if sel & 1 == 0 {
        PEER_MAC
    } else {
        [0x02, 0, 0, 0x77, 0, inp.u8()]
    };
    let ip = |inp: &mut Input| match inp.u8() % 4 {
        0 => Ipv4Address::from(PEER_IP),
        1 => Ipv4Address::new(10, 99, 0, 1),
        2 => Ipv4Address::new(10, 99, 0, inp.u8()),
        _ => Ipv4Address::from(inp.u32().to_be_bytes()),
    };
    let repr = ArpRepr::EthernetIpv4 {
        operation: if sel & 2 == 0 {
            ArpOperation::Request
        } else {
            ArpOperation::Reply
        },
        source_hardware_addr: EthernetAddress(src),
        source_protocol_addr: ip(inp),
        target_hardware_addr: EthernetAddress(to),
        target_protocol_addr: ip(inp),
    };
    let dst = if sel & 4 == 0 { [0xff; 6] } else { to };
    let mut f = ethernet(src, dst, EthernetProtocol::Arp, repr.buffer_len());
    repr.emit(&mut ArpPacket::new_unchecked(&mut f[14..]));
    f
}

/// The peer's answer to an ARP request the RNIC sent for the peer's address.
fn arp_reply_for_peer(f: &[u8]) -> Option<Vec<u8>> {
    let eth = EthernetFrame::new_checked(f).ok()?;
    if eth.ethertype() != EthernetProtocol::Arp {
        return None;
    }
    let ArpRepr::EthernetIpv4 {
        operation: ArpOperation::Request,
        source_hardware_addr,
        source_protocol_addr,
        target_protocol_addr,
        ..
    } = ArpRepr::parse(&ArpPacket::new_checked(eth.payload()).ok()?).ok()?
    else {
        return None;
    };
    if target_protocol_addr != Ipv4Address::from(PEER_IP) {
        return None;
    }
    let reply = ArpRepr::EthernetIpv4 {
        operation: ArpOperation::Reply,
        source_hardware_addr: EthernetAddress(PEER_MAC),
        source_protocol_addr: target_protocol_addr,
        target_hardware_addr: source_hardware_addr,
        target_protocol_addr: source_protocol_addr,
    };
    let mut f = ethernet(
        PEER_MAC,
        source_hardware_addr.0,
        EthernetProtocol::Arp,
        reply.buffer_len(),
    );
    reply.emit(&mut ArpPacket::new_unchecked(&mut f[14..]));
    Some(f)
}

/// Checks that the harness reaches the engine through the port (else it would fuzz only
/// the drop paths): a SEND ONLY from the peer to the RC QP at the expected PSN is
/// acknowledged and lands in the posted receive. Panics otherwise.
pub fn self_check() {
    WORLD.with(|w| {
        let mut w = w.borrow_mut();
        self_check_in(w.get_or_insert_with(World::new));
    });
}

fn self_check_in(w: &mut World) {
    w.reset();
    let received_before = w.nic.lock().unwrap().counters().rx_frames;
    let qpn = w.qps[0];
    // 0x04: RC SEND ONLY.
    let send = TransportRepr::new(BthRepr::new(Opcode(0x04), qpn, Psn::new(PEER_PSN)));
    let mut tr = send;
    tr.bth.ack_req = true;
    let f = w.roce_frame(tr, b"through the port", false, None);
    w.inject(&f);
    let sent = w.sent;
    w.poll(4);
    assert!(w.sent > sent, "no ACK for a valid SEND");
    assert!(
        w.nic.lock().unwrap().counters().rx_frames > received_before,
        "the RNIC did not receive the frame"
    );
    let mut out = [Completion::default(); 4];
    let n = w.ctx.poll_cq(w.cq, &mut out).unwrap();
    assert!(
        n == 1 && out[0].status == WcStatus::Success && out[0].byte_len == 16,
        "the SEND's receive completion: {:?}",
        &out[..n]
    );
    assert_eq!(w.buf.to_vec(PAGE, 16), b"through the port");
    w.buf.write(PAGE, &[CANARY; PAGE]);
}

/// Checks that the RNIC keeps per-QP state only for live QPs: 50 QPs created, each sending
/// a packet (which makes its header template), then destroyed, leave no template behind
/// (QP numbers are cyclic, so kept templates would fill every slot of the table over time).
/// Panics otherwise.
pub fn templates_follow_qps() {
    WORLD.with(|w| {
        let mut w = w.borrow_mut();
        let w = w.get_or_insert_with(World::new);
        w.reset();
        // In the PD of the MR the SENDs gather from.
        let pd = w.pd;
        let before = w.nic.lock().unwrap().cached_templates();
        for _ in 0..50 {
            let init = QpInit {
                qp_type: QpType::Ud,
                ..QpInit::rc(pd, w.cq)
            };
            let qpn = w.ctx.create_qp(&init).expect("qp");
            w.bring_up(qpn, 2);
            let wr = SendWr {
                wr_id: 7,
                op: WrOp::Send,
                sg_list: &[w.mr.sge(0, 16)],
                flags: SendFlags::SIGNALED,
                ud: Some(w.peer_ud()),
            };
            w.ctx.post_send(qpn, &wr).expect("post");
            w.poll(4);
            w.drain_cq();
            w.ctx.destroy_qp(qpn).expect("destroy");
        }
        let after = w.nic.lock().unwrap().cached_templates();
        assert!(
            w.sent >= 50,
            "the QPs' SENDs did not go out ({} frames)",
            w.sent
        );
        assert_eq!(after, before, "header templates kept for destroyed QPs");
    });
}

/// The objects the untrusted client of `run_calls` made, so that a call naming a small id
/// (below 8) names the client's own object of that rank: a fresh client's ids depend on
/// what the RNIC made before, and inputs would otherwise rarely name a real object.
#[derive(Default)]
struct Made {
    pds: Vec<roce::memory::PdId>,
    cqs: Vec<CqId>,
    qps: Vec<Qpn>,
}

impl Made {
    fn note(&mut self, r: &ReplyData) {
        match r {
            ReplyData::Pd(p) => self.pds.push(*p),
            ReplyData::Cq(c) => self.cqs.push(*c),
            ReplyData::Qp(q, _) => self.qps.push(*q),
            _ => {}
        }
    }

    fn aim(&self, cmd: &mut Command) {
        fn pick<T: Copy>(made: &[T], small: u32) -> Option<T> {
            (small < 8 && !made.is_empty()).then(|| made[small as usize % made.len()])
        }
        let pd = |p: &mut roce::memory::PdId| {
            if let Some(x) = pick(&self.pds, p.0) {
                *p = x;
            }
        };
        let cq = |c: &mut CqId| {
            if let Some(x) = pick(&self.cqs, c.0) {
                *c = x;
            }
        };
        let qp = |q: &mut Qpn| {
            if let Some(x) = pick(&self.qps, q.value()) {
                *q = x;
            }
        };
        match cmd {
            Command::DeallocPd { pd: p }
            | Command::RegMr { pd: p, .. }
            | Command::AllocMr { pd: p, .. }
            | Command::AllocMw { pd: p, .. }
            | Command::CreateSrq { pd: p, .. } => pd(p),
            Command::DestroyCq { cq: c } | Command::ResizeCq { cq: c, .. } => cq(c),
            Command::CreateQp { init } => {
                pd(&mut init.pd);
                cq(&mut init.send_cq);
                cq(&mut init.recv_cq);
            }
            Command::ModifyQp { qpn, .. }
            | Command::QueryQp { qpn }
            | Command::DestroyQp { qpn }
            | Command::Counters { qpn: Some(qpn) } => qp(qpn),
            _ => {}
        }
    }
}

/// The body of the `host_calls` target: control calls as rnicd reads them from a client's
/// socket (JSON `Request`s, `serde_json` as in `daemon.rs`), executed by the RNIC as its
/// worker executes them (`Nic::call`) for a client attached for this input, with a fresh
/// shared area beside the calls that take one (`AddArea`, `CreateCq`) when the input says
/// so. Inputs are JSON requests separated by newlines; the smoke test seeds one of every
/// command. Checked: nothing panics; the harness's own client (another tenant) keeps every
/// object and still moves data after the input; once the untrusted client is closed, the
/// RNIC holds what it held before and its mbufs are back at their level. Returns how many
/// calls succeeded.
pub fn run_calls(data: &[u8]) -> usize {
    use dataplane::abi::proto::{Body, Request};
    WORLD.with(|w| {
        let mut w = w.borrow_mut();
        let w = w.get_or_insert_with(World::new);
        let (objects, level) = {
            let nic = w.nic.lock().unwrap();
            (nic.host_objects().len(), nic.pool_in_use())
        };
        let (_rings, host) =
            dataplane::host::host_end(w.limits, ClientLimits::default(), "fuzz-calls")
                .expect("rings");
        let token = host.token;
        assert!(w.nic.lock().unwrap().add_host(host));
        let mut ok = 0;
        let mut made = Made::default();
        for (i, line) in data.split(|&b| b == b'\n').take(64).enumerate() {
            let Ok(req) = serde_json::from_slice::<Request>(line) else {
                continue;
            };
            let Body::Call(cmd) = req.body else {
                continue;
            };
            // Every other call that may take an area gets one (64 KiB, sealed like a
            // client's).
            let area = (i % 2 == 0)
                .then(|| Area::new(1 << 16, "fuzz-area").ok().map(Arc::new))
                .flatten();
            let mut cmd = cmd;
            made.aim(&mut cmd);
            let r = w.nic.lock().unwrap().call(token, cmd, area);
            if let Ok(reply) = &r {
                made.note(reply);
            }
            ok += r.is_ok() as usize;
            w.poll(1);
        }
        w.nic.lock().unwrap().close_host(token);
        w.now += SEC;
        w.poll(4);
        let nic = w.nic.lock().unwrap();
        assert_eq!(
            nic.host_objects().len(),
            objects,
            "clients after the untrusted one closed"
        );
        assert!(
            nic.pool_in_use() <= level,
            "mbufs held after the untrusted client closed"
        );
        drop(nic);
        // The other tenant is untouched: its QPs come back up and carry a SEND.
        self_check_in(w);
        ok
    })
}

/// Runs one input (see the module's doc).
pub fn run(data: &[u8]) {
    WORLD.with(|w| {
        let mut w = w.borrow_mut();
        let w = w.get_or_insert_with(World::new);
        w.reset();
        let level = w.nic.lock().unwrap().pool_in_use();
        let start = w.now;
        crate::script(data, MAX_STEPS, |inp| w.step(inp));
        // Time enough for every timer: retries (2 of 4 ms), RNR waits, UD holds, pauses.
        for _ in 0..40 {
            w.now += 100 * MS;
            w.poll(4);
            w.drain_cq();
        }
        let v = w.buf.to_vec(0, 3 * PAGE);
        let outside = v[..PAGE].iter().chain(&v[2 * PAGE..]);
        let bad = outside.filter(|&&b| b != CANARY).count();
        assert_eq!(bad, 0, "{bad} bytes written outside the MR");
        assert_eq!(
            w.completed, w.posted,
            "every send WR ends: completions against WRs posted"
        );
        let ms = (w.now - start) / MS;
        assert!(
            w.sent <= SENT_PER_RECEIVED * w.received + ms + 16,
            "{} frames sent for {} received in {ms} ms",
            w.sent,
            w.received
        );
        let after = w.nic.lock().unwrap().pool_in_use();
        assert!(
            after <= level,
            "mbufs in use: {level} before the input, {after} after"
        );
        // The MR's page back to its canaries for the next input (receives wrote it).
        w.buf.write(PAGE, &[CANARY; PAGE]);
    });
}
