//! Replay against Linux Soft-RoCE: the captures in tests/corpus were taken between two rxe
//! stacks (client 10.99.0.2, server 10.99.0.4). Their JSON gives each side's QPN, PSN, rkey
//! and buffer address.
//!
//! * Responder: the client's request frames are fed to a ferroce responder set up with the
//!   server's QP state; its ACKs, READ responses and ATOMIC ACKs must equal rxe's, field by
//!   field (opcode, PSN, MSN, syndrome, data), and WRITE/SEND data must land where the RETH or
//!   receive buffer says.
//! * Completer: a ferroce requester posts the WRs perftest posted; its request frames must equal
//!   the client's (opcode, PSN, headers, length), and fed rxe's responses it must complete every
//!   WR successfully with the data rxe returned.
//! * Lossy capture (2% loss): the responder sends the same NAKs rxe sent, and the requester, fed
//!   rxe's NAKs, goes back to the same PSNs.
//!
//! QPNs and rkeys differ between ferroce and the capture, so frames are rewritten (and their
//! ICRC recomputed) on the way in; everything else is the captured bytes.

use std::collections::HashMap;
use std::path::Path;

use roce::engine::{CreditMode, Device, DeviceConfig, QpInit, Transmit};
use roce::memory::{HeapMemory, Memory};
use roce::pcap::Reader;
use roce::sim::{bring_up, ConnectOpts, Endpoint};
use roce::types::{Gid, Lkey, Psn, Qpn, Rkey};
use roce::verbs::*;
use roce::wire::frame::{self, FrameRepr, ParsedFrame};
use roce::wire::opcode::Operation;

const CLIENT: [u8; 4] = [10, 99, 0, 2];
const SERVER: [u8; 4] = [10, 99, 0, 4];

#[derive(Debug, Clone, Copy)]
struct Adv {
    qpn: u32,
    psn: u32,
    rkey: u32,
    vaddr: u64,
}

struct Case {
    frames: Vec<Vec<u8>>,
    client: Vec<Adv>,
    server: Vec<Adv>,
}

fn hex(v: &serde_json::Value) -> u64 {
    u64::from_str_radix(v.as_str().unwrap().trim_start_matches("0x"), 16).unwrap()
}

fn load(name: &str) -> Case {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/corpus");
    let data = std::fs::read(dir.join(format!("{name}.pcap"))).unwrap();
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join(format!("{name}.json"))).unwrap()).unwrap();
    let frames = Reader::new(&data)
        .unwrap()
        .map(|r| r.unwrap().data.to_vec())
        .filter(|f| frame::parse(f).is_ok())
        .collect();
    let mut client = Vec::new();
    let mut server = Vec::new();
    let num = |v: &serde_json::Value| if v.is_string() { hex(v) } else { 0 };
    for a in json["advertised"].as_array().unwrap() {
        if !a["qpn"].is_string() {
            continue; // rping advertises buffers only
        }
        let adv = Adv {
            qpn: hex(&a["qpn"]) as u32,
            psn: hex(&a["psn"]) as u32,
            rkey: num(&a["rkey"]) as u32,
            vaddr: num(&a["vaddr"]),
        };
        if a["side"].as_str().unwrap().starts_with('A') {
            client.push(adv);
        } else {
            server.push(adv);
        }
    }
    Case {
        frames,
        client,
        server,
    }
}

fn from(p: &ParsedFrame, ip: [u8; 4]) -> bool {
    p.repr.ip.gids().0 == Gid::from_ipv4(ip)
}

/// The index among `advs` of the QP that `p` is addressed to.
fn qp_index(advs: &[Adv], p: &ParsedFrame) -> Option<usize> {
    let qpn = p.repr.transport.bth.dest_qp.value();
    advs.iter().position(|a| a.qpn == qpn)
}

/// Re-emits `f` with a new destination QP and, where present, a new rkey.
fn rewrite(f: &[u8], p: &ParsedFrame, dqpn: Qpn, rkeys: &HashMap<u32, Rkey>) -> Vec<u8> {
    let mut repr: FrameRepr = p.repr;
    repr.transport.bth.dest_qp = dqpn;
    if let Some(r) = repr.transport.ext.reth.as_mut() {
        if let Some(k) = rkeys.get(&r.rkey.0) {
            r.rkey = *k;
        }
    }
    if let Some(a) = repr.transport.ext.atomic_eth.as_mut() {
        if let Some(k) = rkeys.get(&a.rkey.0) {
            a.rkey = *k;
        }
    }
    let mut out = vec![0u8; p.frame_len];
    repr.emit(&mut out, p.payload(f)).unwrap();
    out
}

/// What we compare of a response.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Resp {
    opcode: u8,
    psn: Psn,
    dqpn: u32,
    syndrome: Option<u8>,
    msn: Option<u32>,
    orig: Option<u64>,
    payload: Vec<u8>,
}

fn resp_of(p: &ParsedFrame, f: &[u8]) -> Resp {
    let t = &p.repr.transport;
    Resp {
        opcode: t.bth.opcode.0,
        psn: t.bth.psn,
        dqpn: t.bth.dest_qp.value(),
        syndrome: t.ext.aeth.map(|a| a.syndrome),
        msn: t.ext.aeth.map(|a| a.msn.value()),
        orig: t.ext.atomic_ack.map(|a| a.orig),
        payload: p.payload(f).to_vec(),
    }
}

fn rxe_config(gid: [u8; 4]) -> DeviceConfig {
    DeviceConfig {
        gids: vec![Gid::from_ipv4(gid)],
        port_mtu: Mtu::M1024,
        credits: CreditMode::Unlimited,
        ..Default::default()
    }
}

/// One side of the replay: a device with a QP per advertised QP, one MR covering every
/// advertised buffer.
struct Side {
    dev: Device,
    eps: Vec<Endpoint>,
    mem: std::sync::Arc<HeapMemory>,
    base: u64,
    rkeys: HashMap<u32, Rkey>,
    lkey: Lkey,
}

const SPAN: u64 = 16 << 20;

fn side(me: &[Adv], peer: &[Adv], my_ip: [u8; 4], peer_ip: [u8; 4], depth: u32) -> Side {
    let mut dev = Device::new(rxe_config(my_ip));
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(65536).unwrap();
    let base = me.iter().map(|a| a.vaddr).min().unwrap() & !0xfff;
    let mem = HeapMemory::shared(SPAN as usize);
    let (lkey, rkey) = dev
        .reg_mr(pd, mem.clone(), 0, base, SPAN, Access::ALL)
        .unwrap();
    let mut eps = Vec::new();
    let mut rkeys = HashMap::new();
    for (m, p) in me.iter().zip(peer) {
        let qpn = dev
            .create_qp(&QpInit {
                caps: QpCaps {
                    max_send_wr: depth,
                    max_recv_wr: depth,
                    ..Default::default()
                },
                ..QpInit::rc(pd, cq)
            })
            .unwrap();
        let ep = Endpoint {
            pd,
            cq,
            qpn,
            mem: mem.clone(),
            addr: base,
            lkey,
            rkey: rkey.unwrap(),
            sq_psn: Psn::new(m.psn),
        };
        let o = ConnectOpts {
            mtu: Mtu::M1024,
            rd_atomic: 128,
            min_rnr_timer: 12,
            timeout: 14,
            ..Default::default()
        };
        bring_up(
            &mut dev,
            &ep,
            Qpn::new(p.qpn),
            Gid::from_ipv4(peer_ip),
            &o,
            m.psn,
            p.psn,
        );
        rkeys.insert(m.rkey, rkey.unwrap());
        eps.push(ep);
    }
    Side {
        dev,
        eps,
        mem,
        base,
        rkeys,
        lkey,
    }
}

fn drain(dev: &mut Device, mac: [u8; 6]) -> Vec<(ParsedFrame, Vec<u8>)> {
    let mut out = Vec::new();
    let mut tx = Transmit::default();
    let mut buf = vec![0u8; 9000];
    while dev.poll_transmit(0, &mut tx) {
        let n = dev.write_frame(&tx, mac, mac, None, 0, &mut buf).unwrap();
        let f = buf[..n].to_vec();
        out.push((frame::parse(&f).unwrap(), f));
    }
    out
}

/// Feeds the client's requests to a ferroce responder and compares its responses with the
/// server's, per QP. Returns the responder side for further checks.
fn responder_replay(name: &str, recvs: u32) -> (Side, Case) {
    let case = load(name);
    let mut s = side(&case.server, &case.client, SERVER, CLIENT, 4096);
    // Our QP for each captured server QPN.
    let qmap: HashMap<u32, usize> = case
        .server
        .iter()
        .enumerate()
        .map(|(i, a)| (a.qpn, i))
        .collect();
    for ep in &s.eps {
        for i in 0..recvs {
            let sge = Sge {
                addr: s.base + (8 << 20) + (i as u64 % 64) * 65536,
                length: 65536,
                lkey: s.lkey,
            };
            s.dev
                .post_recv(
                    ep.qpn,
                    &RecvWr {
                        wr_id: i as u64,
                        sg_list: &[sge],
                    },
                )
                .unwrap();
        }
    }
    // rxe's responses, per server QP index, in order; and READ/ATOMIC results by PSN so our
    // memory can hold what rxe's did.
    let mut theirs: Vec<Vec<Resp>> = vec![Vec::new(); case.server.len()];
    let mut by_psn: HashMap<(usize, u32), Resp> = HashMap::new();
    for f in &case.frames {
        let p = frame::parse(f).unwrap();
        if from(&p, SERVER) && !p.info().is_request {
            let qi = qp_index(&case.client, &p);
            let Some(qi) = qi else { continue };
            let r = resp_of(&p, f);
            by_psn
                .entry((qi, r.psn.value()))
                .or_insert_with(|| r.clone());
            theirs[qi].push(r);
        }
    }
    let mut ours: Vec<Vec<Resp>> = vec![Vec::new(); case.server.len()];
    let mtu = 1024u64;
    for f in &case.frames {
        let p = frame::parse(f).unwrap();
        if !(from(&p, CLIENT) && p.info().is_request) {
            continue;
        }
        let Some(&qi) = qmap.get(&p.repr.transport.bth.dest_qp.value()) else {
            continue;
        };
        let t = &p.repr.transport;
        // Give our memory the contents rxe's had, for what this request reads.
        match p.info().op {
            Operation::ReadRequest => {
                let reth = t.ext.reth.unwrap();
                let n = reth.len.div_ceil(1024).max(1);
                for k in 0..n {
                    if let Some(r) = by_psn.get(&(qi, t.bth.psn.add(k).value())) {
                        let at = reth.va + k as u64 * mtu - s.base;
                        s.mem.write(at as usize, &r.payload).unwrap();
                    }
                }
            }
            Operation::CompareSwap | Operation::FetchAdd => {
                let a = t.ext.atomic_eth.unwrap();
                if let Some(r) = by_psn.get(&(qi, t.bth.psn.value())) {
                    let now = s.mem.to_vec((a.va - s.base) as usize, 8);
                    let orig = r.orig.unwrap();
                    // Only before the first access to this word (later ones see our result).
                    if now == [0u8; 8] {
                        s.mem
                            .write((a.va - s.base) as usize, &orig.to_ne_bytes())
                            .unwrap();
                    }
                }
            }
            _ => {}
        }
        let g = rewrite(f, &p, s.eps[qi].qpn, &s.rkeys);
        s.dev.handle_frame(0, &g);
        for (rp, rf) in drain(&mut s.dev, [2, 0, 0, 0x99, 0, 4]) {
            let qpn = rp.repr.transport.bth.dest_qp.value();
            let qi = case.client.iter().position(|a| a.qpn == qpn).unwrap();
            ours[qi].push(resp_of(&rp, &rf));
        }
        // WRITE data lands at the RETH's address.
        if p.info().op == Operation::Write && p.info().first {
            let reth = t.ext.reth.unwrap();
            let got = s.mem.to_vec((reth.va - s.base) as usize, p.payload_len);
            assert_eq!(
                got,
                p.payload(f),
                "{name}: WRITE data not at the RETH address"
            );
        }
    }
    for qi in 0..case.server.len() {
        assert!(
            !theirs[qi].is_empty(),
            "{name}: no rxe responses on QP {qi}"
        );
        for (i, (o, t)) in ours[qi].iter().zip(&theirs[qi]).enumerate() {
            assert_eq!(o, t, "{name}: QP {qi} response {i} differs from rxe's");
        }
        assert_eq!(
            ours[qi].len(),
            theirs[qi].len(),
            "{name}: QP {qi}: number of responses"
        );
    }
    (s, case)
}

#[test]
fn responder_matches_rxe_write_bw_4k() {
    responder_replay("write_bw_4k", 0);
}

#[test]
fn responder_matches_rxe_write_bw_64k() {
    responder_replay("write_bw_64k", 0);
}

#[test]
fn responder_matches_rxe_write_bw_two_qps() {
    responder_replay("write_bw_2qp", 0);
}

#[test]
fn responder_matches_rxe_read_bw_64k() {
    responder_replay("read_bw_64k", 0);
}

#[test]
fn responder_matches_rxe_read_lat() {
    responder_replay("read_lat", 0);
}

#[test]
fn responder_matches_rxe_atomics() {
    responder_replay("atomic_faa", 0);
    responder_replay("atomic_cas", 0);
}

#[test]
fn responder_matches_rxe_send_bw_and_places_the_data() {
    let (mut s, case) = responder_replay("send_bw_2k", 64);
    // Every SEND completed into a receive buffer with the bytes rxe received.
    let mut got = Vec::new();
    while let Some(c) = s.dev.poll_completion(s.eps[0].cq) {
        got.push(c);
    }
    let sends = case
        .frames
        .iter()
        .filter(|f| {
            let p = frame::parse(f).unwrap();
            from(&p, CLIENT) && p.info().op == Operation::Send && p.info().last
        })
        .count();
    assert_eq!(got.len(), sends);
    assert!(got
        .iter()
        .all(|c| c.status == WcStatus::Success && c.byte_len == 2048));
}

#[test]
fn responder_matches_rxe_write_lat_acks() {
    responder_replay("write_lat", 0);
}

/// A request message of the client, rebuilt from its packets.
struct Msg {
    qi: usize,
    op: WrOp,
    data: Vec<u8>,
    len: u32,
}

/// The client's request messages in PSN order (each PSN's first transmission; a message
/// whose packets are not all in the capture is left out).
fn messages(case: &Case) -> Vec<Msg> {
    // First transmission of every request PSN, per QP, ordered by PSN from the QP's start.
    let mut pkts: Vec<Vec<(u32, Vec<u8>)>> = vec![Vec::new(); case.client.len()];
    let mut seen: Vec<std::collections::HashSet<u32>> = vec![Default::default(); case.client.len()];
    for f in &case.frames {
        let p = frame::parse(f).unwrap();
        if !(from(&p, CLIENT) && p.info().is_request) {
            continue;
        }
        let t = &p.repr.transport;
        let Some(qi) = qp_index(&case.server, &p) else {
            continue;
        };
        if seen[qi].insert(t.bth.psn.value()) {
            let rel = t.bth.psn.diff(Psn::new(case.client[qi].psn)) as u32;
            pkts[qi].push((rel, f.clone()));
        }
    }
    let mut msgs: Vec<(usize, u32, Msg)> = Vec::new();
    for (qi, list) in pkts.iter_mut().enumerate() {
        list.sort_by_key(|(rel, _)| *rel);
        let mut cur: Option<(u32, Msg)> = None;
        let mut expect_rel = 0u32;
        for (rel, f) in list.iter() {
            let p = frame::parse(f).unwrap();
            let info = p.info();
            let t = &p.repr.transport;
            let payload = p.payload(f).to_vec();
            if *rel != expect_rel {
                break; // a gap: the rest is not in the capture
            }
            expect_rel = rel
                + match info.op {
                    Operation::ReadRequest => t.ext.reth.unwrap().len.div_ceil(1024).max(1),
                    _ => 1,
                };
            if !info.first {
                let Some((_, m)) = cur.as_mut() else { break };
                m.data.extend_from_slice(&payload);
                if let Some(imm) = t.ext.imm {
                    m.op = match m.op {
                        WrOp::Write { remote_addr, rkey } => WrOp::WriteWithImm {
                            remote_addr,
                            rkey,
                            imm: imm.imm,
                        },
                        WrOp::Send => WrOp::SendWithImm { imm: imm.imm },
                        o => o,
                    };
                }
                if info.last {
                    let (start, mut m) = cur.take().unwrap();
                    m.len = m.data.len() as u32;
                    msgs.push((qi, start, m));
                }
                continue;
            }
            let op = match info.op {
                Operation::Write => {
                    let r = t.ext.reth.unwrap();
                    match t.ext.imm {
                        Some(i) => WrOp::WriteWithImm {
                            remote_addr: r.va,
                            rkey: r.rkey,
                            imm: i.imm,
                        },
                        None => WrOp::Write {
                            remote_addr: r.va,
                            rkey: r.rkey,
                        },
                    }
                }
                Operation::Send => match t.ext.imm {
                    Some(i) => WrOp::SendWithImm { imm: i.imm },
                    None => WrOp::Send,
                },
                Operation::ReadRequest => {
                    let r = t.ext.reth.unwrap();
                    WrOp::Read {
                        remote_addr: r.va,
                        rkey: r.rkey,
                    }
                }
                Operation::CompareSwap => {
                    let a = t.ext.atomic_eth.unwrap();
                    WrOp::CompareSwap {
                        remote_addr: a.va,
                        rkey: a.rkey,
                        compare: a.compare,
                        swap: a.swap_add,
                    }
                }
                Operation::FetchAdd => {
                    let a = t.ext.atomic_eth.unwrap();
                    WrOp::FetchAdd {
                        remote_addr: a.va,
                        rkey: a.rkey,
                        add: a.swap_add,
                    }
                }
                o => panic!("unexpected request {o:?}"),
            };
            let len = match info.op {
                Operation::ReadRequest => t.ext.reth.unwrap().len,
                Operation::CompareSwap | Operation::FetchAdd => 8,
                _ => payload.len() as u32,
            };
            let m = Msg {
                qi,
                op,
                data: payload,
                len,
            };
            if info.last {
                msgs.push((qi, *rel, m));
            } else {
                cur = Some((*rel, m));
            }
        }
    }
    // Post in the order the client started them (capture order of first packets is
    // equivalent per QP; across QPs any interleaving is fine).
    msgs.sort_by_key(|(qi, rel, _)| (*rel, *qi));
    msgs.into_iter().map(|(_, _, m)| m).collect()
}

/// The request fields compared with rxe's: the whole transport header (PSN, opcode, AckReq,
/// RETH, AtomicETH, ImmDt...) and the payload.
fn req_key(p: &ParsedFrame, f: &[u8]) -> (roce::wire::frame::TransportRepr, Vec<u8>) {
    (p.repr.transport, p.payload(f).to_vec())
}

/// Posts the client's WRs on a ferroce requester, checks every request it sends against the
/// capture, feeds rxe's responses back, and checks the completions and the data returned.
/// In `lossy` mode retransmissions are not compared packet by packet; instead, after every NAK
/// fed in, the next request sent must go back to the NAK's PSN, as rxe's did.
fn completer_replay(name: &str, lossy: bool) {
    let case = load(name);
    let mut c = side(&case.client, &case.server, CLIENT, SERVER, 4096);
    let msgs = messages(&case);
    let mut off = 4 << 20;
    let mut reads = Vec::new();
    for (i, m) in msgs.iter().enumerate() {
        let sge = Sge {
            addr: c.base + off,
            length: m.len,
            lkey: c.lkey,
        };
        c.mem.write(off as usize, &m.data).unwrap();
        if m.op.is_read_or_atomic() {
            reads.push((i, off));
        }
        c.dev
            .post_send(
                c.eps[m.qi].qpn,
                &SendWr {
                    wr_id: i as u64,
                    op: m.op,
                    sg_list: &[sge],
                    flags: SendFlags::SIGNALED,
                    ud: None,
                },
            )
            .unwrap();
        off += (m.len as u64 + 63) & !63;
    }
    let mut pending: Vec<std::collections::VecDeque<(ParsedFrame, Vec<u8>)>> =
        vec![Default::default(); case.client.len()];
    let mut seen: Vec<std::collections::HashSet<u32>> = vec![Default::default(); case.client.len()];
    let mut compared = 0;
    let mut rewinds = 0;
    let mut expect_psn: Vec<Option<Psn>> = vec![None; case.client.len()];
    for f in &case.frames {
        let p = frame::parse(f).unwrap();
        for (rp, rf) in drain(&mut c.dev, [2, 0, 0, 0x99, 0, 2]) {
            let qi = qp_index(&case.server, &rp).unwrap();
            if let Some(want) = expect_psn[qi].take() {
                assert_eq!(
                    rp.repr.transport.bth.psn, want,
                    "{name}: after a NAK the requester must go back to its PSN"
                );
                rewinds += 1;
            }
            pending[qi].push_back((rp, rf));
        }
        let t = &p.repr.transport;
        if from(&p, CLIENT) && p.info().is_request {
            let Some(qi) = qp_index(&case.server, &p) else {
                continue;
            };
            if !seen[qi].insert(t.bth.psn.value()) {
                continue; // a retransmission
            }
            if lossy {
                continue;
            }
            let (op, of) = pending[qi].pop_front().unwrap_or_else(|| {
                panic!(
                    "{name}: ferroce did not send the request rxe sent: {:?}",
                    t.bth
                )
            });
            assert_eq!(
                req_key(&op, &of),
                req_key(&p, f),
                "{name}: request {compared} differs from rxe's"
            );
            compared += 1;
        } else if from(&p, SERVER) && !p.info().is_request {
            let Some(qi) = qp_index(&case.client, &p) else {
                continue;
            };
            if lossy {
                if let Some(a) = t.ext.aeth {
                    if a.syndrome == 0x60 {
                        // Discard what we queued before the NAK: rxe's client had sent it too.
                        pending[qi].clear();
                        expect_psn[qi] = Some(t.bth.psn);
                    }
                }
            }
            let g = rewrite(f, &p, c.eps[qi].qpn, &HashMap::new());
            c.dev.handle_frame(0, &g);
        }
    }
    let mut done = Vec::new();
    while let Some(cq) = c.dev.poll_completion(c.eps[0].cq) {
        done.push(cq);
    }
    assert!(
        done.iter().all(|w| w.status == WcStatus::Success),
        "{name}: {:?}",
        done.iter().find(|w| w.status != WcStatus::Success)
    );
    if lossy {
        assert!(
            rewinds >= 5,
            "{name}: only {rewinds} NAK recoveries checked"
        );
        assert!(done.len() > 5);
        return;
    }
    assert!(compared > 0);
    assert_eq!(done.len(), msgs.len(), "{name}: every WR completes");
    // In order per QP (two QPs share the CQ, so their completions interleave).
    for (qi, ep) in c.eps.iter().enumerate() {
        let got: Vec<u64> = done
            .iter()
            .filter(|w| w.qp_num == ep.qpn)
            .map(|w| w.wr_id)
            .collect();
        let want: Vec<u64> = (0..msgs.len())
            .filter(|&i| msgs[i].qi == qi)
            .map(|i| i as u64)
            .collect();
        assert_eq!(got, want, "{name}: completions of QP {qi} in order");
    }
    // READ and ATOMIC results equal what rxe sent.
    let resp: Vec<(ParsedFrame, Vec<u8>)> = case
        .frames
        .iter()
        .map(|f| (frame::parse(f).unwrap(), f.clone()))
        .filter(|(p, _)| {
            from(p, SERVER)
                && matches!(
                    p.info().op,
                    Operation::ReadResponse | Operation::AtomicAcknowledge
                )
        })
        .collect();
    for (i, off) in reads {
        let m = &msgs[i];
        let got = c.mem.to_vec(off as usize, m.len as usize);
        if let WrOp::Read { .. } = m.op {
            assert!(
                resp.iter()
                    .any(|(p, f)| p.payload(f).len() >= m.len.min(1024) as usize
                        && got.starts_with(&p.payload(f)[..m.len.min(1024) as usize])),
                "{name}: READ {i} data"
            );
        } else {
            assert!(
                resp.iter()
                    .any(|(p, _)| p.repr.transport.ext.atomic_ack.is_some_and(|a| a
                        .orig
                        .to_ne_bytes()
                        .to_vec()
                        == got)),
                "{name}: ATOMIC {i} result"
            );
        }
    }
}

#[test]
fn requester_and_completer_match_rxe_write_bw() {
    completer_replay("write_bw_4k", false);
    completer_replay("write_bw_64k", false);
    completer_replay("write_bw_2qp", false);
}

#[test]
fn requester_and_completer_match_rxe_read_bw() {
    completer_replay("read_bw_64k", false);
    completer_replay("read_lat", false);
}

#[test]
fn requester_and_completer_match_rxe_send_bw_and_atomics() {
    completer_replay("send_bw_2k", false);
    completer_replay("atomic_faa", false);
    completer_replay("atomic_cas", false);
}

#[test]
fn lossy_capture_responder_sends_rxe_naks() {
    // Under 2% loss the responder must NAK the same gaps and re-ACK the same duplicates.
    responder_replay("lossy_write_bw", 0);
}

#[test]
fn lossy_capture_completer_goes_back_to_rxe_nak_psns() {
    completer_replay("lossy_write_bw", true);
}

/// A bare device with one PD, one CQ and one MR over 4 MiB at address 0, for the UD/UC/SRQ
/// replays.
struct Bare {
    dev: Device,
    pd: roce::memory::PdId,
    cq: roce::engine::CqId,
    mem: std::sync::Arc<HeapMemory>,
    lkey: Lkey,
}

fn bare(ip: [u8; 4]) -> Bare {
    let mut dev = Device::new(rxe_config(ip));
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(65536).unwrap();
    let mem = HeapMemory::shared(1 << 22);
    let (lkey, _) = dev
        .reg_mr(pd, mem.clone(), 0, 0, 1 << 22, Access::ALL)
        .unwrap();
    Bare {
        dev,
        pd,
        cq,
        mem,
        lkey,
    }
}

impl Bare {
    /// A QP of type `o.qp_type` (on `srq`, if given) brought up towards `peer` with send PSN
    /// `sq_psn` and receive PSN `rq_psn`.
    fn qp(
        &mut self,
        o: &ConnectOpts,
        srq: Option<roce::engine::SrqId>,
        (peer_qpn, peer_gid): (u32, Gid),
        sq_psn: u32,
        rq_psn: u32,
    ) -> Qpn {
        let init = QpInit {
            qp_type: o.qp_type,
            srq,
            caps: QpCaps {
                max_send_wr: 64,
                max_recv_wr: 512,
                ..Default::default()
            },
            ..QpInit::rc(self.pd, self.cq)
        };
        let qpn = self.dev.create_qp(&init).unwrap();
        let ep = Endpoint {
            pd: self.pd,
            cq: self.cq,
            qpn,
            mem: self.mem.clone(),
            addr: 0,
            lkey: self.lkey,
            rkey: Rkey(0),
            sq_psn: Psn::new(sq_psn),
        };
        let peer = Qpn::new(peer_qpn);
        bring_up(&mut self.dev, &ep, peer, peer_gid, o, sq_psn, rq_psn);
        qpn
    }

    /// Receive buffer `i` of `len` bytes (at `i * len`), as WR `i`.
    fn buffer(&self, i: u64, len: u32) -> Sge {
        Sge {
            addr: i * len as u64,
            length: len,
            lkey: self.lkey,
        }
    }

    /// Posts receive buffer `i` of `len` bytes on `qpn`.
    fn post_buffer(&mut self, qpn: Qpn, i: u64, len: u32) {
        let sge = self.buffer(i, len);
        let wr = RecvWr {
            wr_id: i,
            sg_list: &[sge],
        };
        self.dev.post_recv(qpn, &wr).unwrap();
    }
}

/// Whether `p` is from the client to the capture's first server QP.
fn to_first_server_qp(case: &Case, p: &ParsedFrame) -> bool {
    from(p, CLIENT) && p.repr.transport.bth.dest_qp.value() == case.server[0].qpn
}

#[test]
fn ud_frames_from_rxe_are_received_with_qkey_source_qp_and_grh() {
    for name in ["ud_pingpong", "send_bw_ud"] {
        let case = load(name);
        let mut s = bare(SERVER);
        let o = ConnectOpts {
            qp_type: QpType::Ud,
            ..Default::default()
        };
        let q = s.qp(&o, None, (0, Gid::default()), case.server[0].psn, 0);
        let mut expected = Vec::new();
        for f in &case.frames {
            let p = frame::parse(f).unwrap();
            if !to_first_server_qp(&case, &p) {
                continue;
            }
            s.post_buffer(q, expected.len() as u64, 4096);
            assert_eq!(p.repr.transport.ext.deth.unwrap().qkey.0, 0x1111_1111);
            s.dev.handle_frame(0, &rewrite(f, &p, q, &HashMap::new()));
            expected.push((
                p.repr.transport.ext.deth.unwrap().src_qp,
                f[14..34].to_vec(),
                p.payload(f).to_vec(),
            ));
        }
        assert!(expected.len() >= 20, "{name}");
        for (i, (src, ip_hdr, data)) in expected.iter().enumerate() {
            let c = s.dev.poll_completion(s.cq).unwrap();
            assert_eq!((c.wr_id, c.status), (i as u64, WcStatus::Success), "{name}");
            assert_eq!(c.byte_len as usize, 40 + data.len());
            assert_eq!(c.src_qp, *src);
            assert!(c.wc_flags.contains(WcFlags::GRH));
            let buf = s.mem.to_vec(i * 4096, 40 + data.len());
            assert_eq!(&buf[..20], &[0u8; 20]);
            assert_eq!(
                &buf[20..40],
                &ip_hdr[..],
                "{name}: GRH holds the IPv4 header"
            );
            assert_eq!(&buf[40..], &data[..]);
        }
    }
}

#[test]
fn uc_messages_from_rxe_are_placed_as_sent() {
    let case = load("uc_pingpong");
    let mut s = bare(SERVER);
    let o = ConnectOpts {
        qp_type: QpType::Uc,
        mtu: Mtu::M1024,
        ..Default::default()
    };
    let client = (case.client[0].qpn, Gid::from_ipv4(CLIENT));
    let q = s.qp(&o, None, client, case.server[0].psn, case.client[0].psn);
    for i in 0..64u64 {
        s.post_buffer(q, i, 8192);
    }
    let mut messages: Vec<Vec<u8>> = Vec::new();
    let mut cur = Vec::new();
    for f in &case.frames {
        let p = frame::parse(f).unwrap();
        if !to_first_server_qp(&case, &p) {
            continue;
        }
        cur.extend_from_slice(p.payload(f));
        if p.info().last {
            messages.push(std::mem::take(&mut cur));
        }
        s.dev.handle_frame(0, &rewrite(f, &p, q, &HashMap::new()));
    }
    assert_eq!(messages.len(), 20);
    for (i, m) in messages.iter().enumerate() {
        let c = s.dev.poll_completion(s.cq).unwrap();
        assert_eq!(
            (c.wr_id, c.status, c.byte_len as usize),
            (i as u64, WcStatus::Success, m.len())
        );
        assert_eq!(&s.mem.to_vec(i * 8192, m.len()), m);
    }
    assert!(s.dev.poll_completion(s.cq).is_none());
    assert_eq!(
        s.dev.qp_counters(q).unwrap().sent_pkts,
        0,
        "UC sends no ACKs"
    );
}

#[test]
fn srq_pingpong_from_rxe_consumes_the_shared_queue_and_acks_like_rxe() {
    let case = load("srq_pingpong");
    let mut s = bare(SERVER);
    let srq = s
        .dev
        .create_srq(
            s.pd,
            &roce::engine::SrqAttr {
                max_wr: 512,
                max_sge: 1,
                srq_limit: 0,
            },
        )
        .unwrap();
    for i in 0..512u64 {
        let wr = RecvWr {
            wr_id: i,
            sg_list: &[s.buffer(i, 8192)],
        };
        s.dev.post_srq_recv(srq, &wr).unwrap();
    }
    let mut ours: HashMap<u32, Qpn> = HashMap::new();
    let o = ConnectOpts {
        mtu: Mtu::M1024,
        ..Default::default()
    };
    for (sv, c) in case.server.iter().zip(&case.client) {
        let client = (c.qpn, Gid::from_ipv4(CLIENT));
        let q = s.qp(&o, Some(srq), client, sv.psn, c.psn);
        ours.insert(sv.qpn, q);
    }
    assert_eq!(ours.len(), 16);
    let mut theirs: Vec<Resp> = Vec::new();
    let mut mine: Vec<Resp> = Vec::new();
    let mut sends = 0;
    for f in &case.frames {
        let p = frame::parse(f).unwrap();
        let t = &p.repr.transport;
        if from(&p, SERVER) && t.bth.opcode == roce::wire::opcode::Opcode::RC_ACK {
            theirs.push(resp_of(&p, f));
        }
        if !from(&p, CLIENT) || !p.info().is_request {
            continue;
        }
        let Some(&q) = ours.get(&t.bth.dest_qp.value()) else {
            continue;
        };
        sends += p.info().last as usize;
        s.dev.handle_frame(0, &rewrite(f, &p, q, &HashMap::new()));
        for (rp, rf) in drain(&mut s.dev, [2, 0, 0, 0x99, 0, 4]) {
            mine.push(resp_of(&rp, &rf));
        }
    }
    assert_eq!(mine, theirs, "ACKs (PSN, MSN, syndrome 0x1f) equal rxe's");
    let mut n = 0;
    while let Some(c) = s.dev.poll_completion(s.cq) {
        assert_eq!(c.status, WcStatus::Success);
        n += 1;
    }
    assert_eq!(n, sends);
}

#[test]
fn rdma_cm_mads_to_qp1_are_counted() {
    for name in ["rping", "write_bw_rdmacm"] {
        let case = load(name);
        let mut dev = bare(SERVER).dev;
        let mut mads = 0;
        for f in &case.frames {
            let p = frame::parse(f).unwrap();
            if from(&p, CLIENT) {
                mads += (p.repr.transport.bth.dest_qp == Qpn::GSI) as u64;
                dev.handle_frame(0, f);
            }
        }
        assert!(mads >= 3, "{name}");
        assert_eq!(dev.counters().0.rx_gsi_mads, mads, "{name}");
    }
}
