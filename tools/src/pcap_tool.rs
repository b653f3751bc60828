//! The logic of `rnic-pcap`: decoding captures to text or JSON, verifying them, and
//! generating sample frames of every opcode.

use std::fmt::Write as _;

use roce::pcap::{Reader, Writer};
use roce::types::{Gid, Msn, Psn, Qkey, Qpn, Rkey};
use roce::wire::aeth::{AethKind, AethRepr, NakCode};
use roce::wire::atomic_ack_eth::AtomicAckEthRepr;
use roce::wire::atomic_eth::AtomicEthRepr;
use roce::wire::bth::BthRepr;
use roce::wire::cnp::CnpRepr;
use roce::wire::deth::DethRepr;
use roce::wire::ethernet::{self, mac_to_string, EthernetRepr, VlanTag};
use roce::wire::feth::FethRepr;
use roce::wire::frame::{self, classify, FrameKind, FrameRepr, IpRepr, ParsedFrame, TransportRepr};
use roce::wire::ieth::IethRepr;
use roce::wire::imm::ImmRepr;
use roce::wire::ipv4::{Ecn, Ipv4Repr};
use roce::wire::ipv6::Ipv6Repr;
use roce::wire::mac_control::{self, MacControlRepr};
use roce::wire::opcode::{Opcode, OPCODES};
use roce::wire::reth::RethRepr;
use serde_json::{json, Map, Value};

/// Decodes one frame (1-based `n`) to the JSON object `rnic-pcap decode --json` prints.
pub fn decode_json(n: usize, f: &[u8]) -> Value {
    let kind = classify(f);
    let mut o = Map::new();
    o.insert("frame".into(), json!(n));
    o.insert("kind".into(), json!(kind.name()));
    o.insert("len".into(), json!(f.len()));
    if let Ok(eth) = ethernet::Frame::new_checked(f) {
        o.insert("src_mac".into(), json!(mac_to_string(&eth.src())));
        o.insert("dst_mac".into(), json!(mac_to_string(&eth.dst())));
        if let Some(tci) = eth.tci() {
            let t = VlanTag::from_tci(tci);
            o.insert(
                "vlan".into(),
                json!({"pcp": t.pcp, "dei": t.dei, "vid": t.vid}),
            );
        }
    }
    match kind {
        FrameKind::Roce | FrameKind::Cnp => match frame::inspect(f) {
            Ok(p) => {
                roce_fields(&mut o, &p);
                mad_fields(&mut o, &p, f);
            }
            Err(e) => {
                o.insert("error".into(), json!(e.to_string()));
            }
        },
        FrameKind::Pfc | FrameKind::Pause => {
            let l3 = ethernet::Frame::new_unchecked(f).header_len();
            match MacControlRepr::parse(&mac_control::Packet::new_unchecked(&f[l3..])) {
                Ok(MacControlRepr::Pfc {
                    class_enable,
                    quanta,
                }) => {
                    o.insert("class_enable".into(), json!(class_enable));
                    o.insert("quanta".into(), json!(quanta));
                }
                Ok(MacControlRepr::Pause { quanta }) => {
                    o.insert("quanta".into(), json!(quanta));
                }
                Ok(MacControlRepr::Unknown(op)) => {
                    o.insert(
                        "error".into(),
                        json!(format!("MAC control opcode {op:#06x}")),
                    );
                }
                Err(e) => {
                    o.insert("error".into(), json!(e.to_string()));
                }
            }
        }
        FrameKind::Arp => {
            use roce::wire::arp::{ArpPacket, ArpRepr};
            let l3 = ethernet::Frame::new_unchecked(f).header_len();
            match ArpPacket::new_checked(&f[l3..]).and_then(|p| ArpRepr::parse(&p)) {
                Ok(ArpRepr::EthernetIpv4 {
                    operation,
                    source_hardware_addr,
                    source_protocol_addr,
                    target_protocol_addr,
                    ..
                }) => {
                    o.insert("op".into(), json!(format!("{operation:?}").to_lowercase()));
                    o.insert(
                        "sender_mac".into(),
                        json!(mac_to_string(&source_hardware_addr.0)),
                    );
                    o.insert("sender_ip".into(), json!(source_protocol_addr.to_string()));
                    o.insert("target_ip".into(), json!(target_protocol_addr.to_string()));
                }
                Ok(_) => {}
                Err(e) => {
                    o.insert("error".into(), json!(e.to_string()));
                }
            }
        }
        FrameKind::Other => ip_fields(&mut o, f),
    }
    Value::Object(o)
}

/// IPv4/IPv6 frames that are not RoCE: names the protocol (`kind` becomes icmp, icmpv6, nd,
/// tcp, udp, ipv4 or ipv6) with its addresses, ports and ICMP type.
fn ip_fields(o: &mut Map<String, Value>, f: &[u8]) {
    let Ok(eth) = ethernet::Frame::new_checked(f) else {
        return;
    };
    let body = &f[eth.header_len()..];
    let (src, dst, proto, l4): (String, String, u8, &[u8]) = match eth.ethertype() {
        ethernet::ethertype::IPV4 if body.len() >= 20 => {
            let hl = ((body[0] & 0x0f) as usize * 4).clamp(20, body.len());
            let a =
                |i: usize| std::net::Ipv4Addr::new(body[i], body[i + 1], body[i + 2], body[i + 3]);
            (a(12).to_string(), a(16).to_string(), body[9], &body[hl..])
        }
        ethernet::ethertype::IPV6 if body.len() >= 40 => {
            let a = |i: usize| {
                let mut b = [0u8; 16];
                b.copy_from_slice(&body[i..i + 16]);
                std::net::Ipv6Addr::from(b)
            };
            (a(8).to_string(), a(24).to_string(), body[6], &body[40..])
        }
        _ => return,
    };
    let v6 = eth.ethertype() == ethernet::ethertype::IPV6;
    o.insert("src".into(), json!(src));
    o.insert("dst".into(), json!(dst));
    let port = |i: usize| l4.get(i..i + 2).map(|p| u16::from_be_bytes([p[0], p[1]]));
    let kind = match proto {
        1 | 58 => {
            if let Some(&t) = l4.first() {
                o.insert("icmp_type".into(), json!(t));
                o.insert("icmp_code".into(), json!(l4.get(1).copied().unwrap_or(0)));
            }
            match (proto, l4.first()) {
                // RFC 4861: router/neighbour solicitation and advertisement, redirect.
                (58, Some(133..=137)) => "nd",
                (58, _) => "icmpv6",
                _ => "icmp",
            }
        }
        6 | 17 => {
            if let (Some(sp), Some(dp)) = (port(0), port(2)) {
                o.insert("sport".into(), json!(sp));
                o.insert("dport".into(), json!(dp));
            }
            if proto == 6 {
                "tcp"
            } else {
                "udp"
            }
        }
        _ if v6 => "ipv6",
        _ => "ipv4",
    };
    o.insert("kind".into(), json!(kind));
}

/// A MAD on QP1 (a UD SEND with the GSI's Q_Key): its class, method and attribute, and a
/// connection manager message's fields (`cm`, with `msg` naming it), as tshark's dissector
/// shows them; a REQ's service ID as rdma_cm's port space and port (`rdma_cm`).
fn mad_fields(o: &mut Map<String, Value>, p: &ParsedFrame, frame: &[u8]) {
    use roce::wire::mad::{self, CmMessage, Mad};
    let t = &p.repr.transport;
    let gsi = t.bth.dest_qp.value() == 1 && t.ext.deth.is_some_and(|d| d.qkey.0 == mad::GSI_QKEY);
    if !gsi || p.payload_offset + p.payload_len > frame.len() {
        return;
    }
    let m = match Mad::parse(p.payload(frame)) {
        Ok(m) => m,
        Err(e) => {
            o.insert("mad".into(), json!({"error": e.to_string()}));
            return;
        }
    };
    let h = m.header;
    let class = h
        .class_name()
        .map_or_else(|| format!("{:#04x}", h.class), String::from);
    let mut v = json!({
        "class": class,
        "method": h.method_name(),
        "attr_id": h.attr_id,
        "tid": h.tid,
        "status": h.status,
    });
    if let Some(cm) = m.cm {
        v["cm"] = serde_json::to_value(cm).unwrap_or(Value::Null);
        // Messages without fields of their own by name (SIDR_REQ, LAP...), not "other".
        v["cm"]["msg"] = json!(cm.name());
        if let CmMessage::Req { service_id, .. } = cm {
            if let Some((space, port)) = mad::rdma_cm_port(service_id) {
                v["rdma_cm"] = json!(format!("{space}:{port}"));
            }
        }
    }
    o.insert("mad".into(), v);
}

fn roce_fields(o: &mut Map<String, Value>, p: &ParsedFrame) {
    let r = &p.repr;
    let b = &r.transport.bth;
    let e = &r.transport.ext;
    let (src, dst) = r.ip.gids();
    o.insert("ip".into(), json!(if r.ip.is_ipv6() { 6 } else { 4 }));
    o.insert("src".into(), json!(ip_string(&src)));
    o.insert("dst".into(), json!(ip_string(&dst)));
    o.insert("opcode".into(), json!(b.opcode.0));
    o.insert("opname".into(), json!(b.opcode.name()));
    o.insert("dqpn".into(), json!(b.dest_qp.value()));
    o.insert("psn".into(), json!(b.psn.value()));
    o.insert("ackreq".into(), json!(b.ack_req));
    o.insert("fecn".into(), json!(b.fecn));
    o.insert("becn".into(), json!(b.becn));
    o.insert("se".into(), json!(b.se));
    o.insert("migreq".into(), json!(b.migreq));
    o.insert("pad".into(), json!(b.pad_count));
    o.insert("pkey".into(), json!(b.pkey.0));
    o.insert("ecn".into(), json!(r.ip.ecn().name()));
    o.insert("dscp".into(), json!(r.ip.dscp()));
    o.insert("sport".into(), json!(r.udp_src_port));
    o.insert("icrc".into(), json!(if p.icrc_ok() { "ok" } else { "bad" }));
    o.insert("payload_len".into(), json!(p.payload_len));
    if let Some(x) = e.reth {
        o.insert(
            "reth".into(),
            json!({"va": x.va, "rkey": x.rkey.0, "len": x.len}),
        );
    }
    if let Some(a) = e.aeth {
        let mut m = Map::new();
        m.insert("syndrome".into(), json!(a.syndrome));
        m.insert("msn".into(), json!(a.msn.value()));
        match a.kind() {
            AethKind::Ack { credits } => {
                m.insert("type".into(), json!("ack"));
                m.insert("credits".into(), json!(credits));
            }
            AethKind::RnrNak { timer } => {
                m.insert("type".into(), json!("rnr"));
                m.insert("rnr_timer".into(), json!(timer));
            }
            AethKind::Nak(code) => {
                m.insert("type".into(), json!("nak"));
                m.insert("nak_code".into(), json!(code.bits()));
                m.insert("nak".into(), json!(code.name()));
            }
            AethKind::Reserved => {
                m.insert("type".into(), json!("reserved"));
            }
        }
        o.insert("aeth".into(), Value::Object(m));
    }
    if let Some(d) = e.deth {
        o.insert(
            "deth".into(),
            json!({"qkey": d.qkey.0, "sqpn": d.src_qp.value()}),
        );
    }
    if let Some(i) = e.imm {
        o.insert("imm".into(), json!(i.imm));
    }
    if let Some(i) = e.ieth {
        o.insert("ieth".into(), json!(i.rkey.0));
    }
    if let Some(a) = e.atomic_eth {
        o.insert(
            "atomic".into(),
            json!({"va": a.va, "rkey": a.rkey.0, "swap_add": a.swap_add, "compare": a.compare}),
        );
    }
    if let Some(a) = e.atomic_ack {
        o.insert("atomic_ack".into(), json!({"orig": a.orig}));
    }
    if let Some(f) = e.feth {
        o.insert("feth".into(), json!(f.raw));
    }
}

fn ip_string(g: &Gid) -> String {
    match g.to_ipv4() {
        Some(a) => format!("{}.{}.{}.{}", a[0], a[1], a[2], a[3]),
        None => g.to_ipv6().to_string(),
    }
}

/// The MAD part of a line: `mad cm send REQ tid 0x... local_comm_id 0x... qpn 0x...` (IDs,
/// QPNs, PSNs and keys in hex, as tshark shows them).
fn mad_line(s: &mut String, m: &Value) {
    if let Some(e) = m.get("error") {
        let _ = write!(s, " mad {}", e.as_str().unwrap_or(""));
        return;
    }
    let text = |v: &Value| v.as_str().unwrap_or("").to_string();
    let _ = write!(s, " mad {} {}", text(&m["class"]), text(&m["method"]));
    match m.get("cm").and_then(|c| c.as_object()) {
        Some(cm) => {
            let _ = write!(s, " {}", text(&cm["msg"]));
            let _ = write!(s, " tid {:#x}", m["tid"].as_u64().unwrap_or(0));
            for (k, v) in cm.iter().filter(|(k, _)| *k != "msg") {
                let hex =
                    k.ends_with("_id") || k.ends_with("qpn") || k.ends_with("psn") || k == "pkey";
                match v.as_u64() {
                    Some(n) if hex => {
                        let _ = write!(s, " {k} {n:#x}");
                    }
                    _ => {
                        let _ = write!(s, " {k} {v}");
                    }
                }
            }
        }
        None => {
            let _ = write!(
                s,
                " attr {:#06x} tid {:#x}",
                m["attr_id"].as_u64().unwrap_or(0),
                m["tid"].as_u64().unwrap_or(0)
            );
        }
    }
    if let Some(r) = m.get("rdma_cm") {
        let _ = write!(s, " rdma_cm {}", text(r));
    }
}

/// One human-readable line per frame (what `rnic-pcap decode` prints).
pub fn decode_line(v: &Value) -> String {
    let g = |k: &str| v.get(k).cloned().unwrap_or(Value::Null);
    let mut s = format!("{:>6} ", g("frame"));
    let kind = g("kind");
    match kind.as_str().unwrap_or("") {
        "roce" | "cnp" if v.get("error").is_some() => {
            let _ = write!(s, "RoCE malformed: {}", g("error").as_str().unwrap_or(""));
        }
        "roce" | "cnp" => {
            let _ = write!(
                s,
                "{} > {} {} dqpn {:#08x} psn {:#08x}",
                g("src").as_str().unwrap_or(""),
                g("dst").as_str().unwrap_or(""),
                g("opname").as_str().unwrap_or(""),
                g("dqpn").as_u64().unwrap_or(0),
                g("psn").as_u64().unwrap_or(0),
            );
            for flag in ["ackreq", "se", "fecn", "becn", "migreq"] {
                if g(flag) == Value::Bool(true) {
                    let _ = write!(s, " {flag}");
                }
            }
            if let Some(x) = v.get("reth") {
                let _ = write!(
                    s,
                    " reth va {:#x} rkey {:#x} len {}",
                    x["va"].as_u64().unwrap_or(0),
                    x["rkey"].as_u64().unwrap_or(0),
                    x["len"]
                );
            }
            if let Some(a) = v.get("aeth") {
                let _ = write!(
                    s,
                    " aeth {} msn {}",
                    a["type"].as_str().unwrap_or(""),
                    a["msn"]
                );
                for k in ["credits", "rnr_timer", "nak"] {
                    if let Some(x) = a.get(k) {
                        let _ = write!(s, " {k} {}", x.to_string().trim_matches('"'));
                    }
                }
            }
            if let Some(d) = v.get("deth") {
                let _ = write!(
                    s,
                    " deth qkey {:#x} sqpn {:#x}",
                    d["qkey"].as_u64().unwrap_or(0),
                    d["sqpn"].as_u64().unwrap_or(0)
                );
            }
            if let Some(i) = v.get("imm") {
                let _ = write!(s, " imm {:#010x}", i.as_u64().unwrap_or(0));
            }
            if let Some(i) = v.get("ieth") {
                let _ = write!(s, " ieth {:#x}", i.as_u64().unwrap_or(0));
            }
            if let Some(a) = v.get("atomic") {
                let _ = write!(
                    s,
                    " atomic va {:#x} rkey {:#x} swap_add {} compare {}",
                    a["va"].as_u64().unwrap_or(0),
                    a["rkey"].as_u64().unwrap_or(0),
                    a["swap_add"],
                    a["compare"]
                );
            }
            if let Some(a) = v.get("atomic_ack") {
                let _ = write!(s, " orig {}", a["orig"]);
            }
            if let Some(m) = v.get("mad") {
                mad_line(&mut s, m);
            }
            let _ = write!(
                s,
                " payload {} ecn {} dscp {} sport {} icrc {}",
                g("payload_len"),
                g("ecn").as_str().unwrap_or(""),
                g("dscp"),
                g("sport"),
                g("icrc").as_str().unwrap_or("")
            );
        }
        "pfc" => {
            let _ = write!(
                s,
                "PFC class_enable {:#04x} quanta {}",
                g("class_enable").as_u64().unwrap_or(0),
                g("quanta")
            );
        }
        "pause" => {
            let _ = write!(s, "PAUSE quanta {}", g("quanta"));
        }
        "arp" => {
            let _ = write!(
                s,
                "ARP {} {} ({}) -> {}",
                g("op").as_str().unwrap_or(""),
                g("sender_ip").as_str().unwrap_or(""),
                g("sender_mac").as_str().unwrap_or(""),
                g("target_ip").as_str().unwrap_or("")
            );
        }
        k @ ("tcp" | "udp") => {
            let _ = write!(
                s,
                "{} {}:{} > {}:{}, {} bytes",
                k.to_uppercase(),
                g("src").as_str().unwrap_or(""),
                g("sport"),
                g("dst").as_str().unwrap_or(""),
                g("dport"),
                g("len")
            );
        }
        k @ ("icmp" | "icmpv6" | "nd") => {
            let name = match (k, g("icmp_type").as_u64().unwrap_or(0)) {
                ("icmp", 0) | ("icmpv6", 129) => "echo reply",
                ("icmp", 8) | ("icmpv6", 128) => "echo request",
                ("icmp", 3) | ("icmpv6", 1) => "destination unreachable",
                ("nd", 133) => "router solicitation",
                ("nd", 134) => "router advertisement",
                ("nd", 135) => "neighbour solicitation",
                ("nd", 136) => "neighbour advertisement",
                ("nd", 137) => "redirect",
                _ => "type",
            };
            let _ = write!(
                s,
                "{} {} > {} {name} ({}), {} bytes",
                if k == "icmp" { "ICMP" } else { "ICMPv6" },
                g("src").as_str().unwrap_or(""),
                g("dst").as_str().unwrap_or(""),
                g("icmp_type"),
                g("len")
            );
        }
        k @ ("ipv4" | "ipv6") => {
            let _ = write!(
                s,
                "{} {} > {}, {} bytes",
                k.to_uppercase(),
                g("src").as_str().unwrap_or(""),
                g("dst").as_str().unwrap_or(""),
                g("len")
            );
        }
        _ => {
            let _ = write!(s, "other, {} bytes", g("len"));
        }
    }
    if let Some(e) = v.get("error").and_then(|e| e.as_str()) {
        if !s.contains(e) {
            let _ = write!(s, " error: {e}");
        }
    }
    s
}

/// Summary of `rnic-pcap verify`.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct VerifySummary {
    /// All frames.
    pub frames: usize,
    /// RoCE frames (CNPs included).
    pub roce: usize,
    /// CNPs.
    pub cnp: usize,
    /// RoCE frames that are malformed or fail the ICRC.
    pub bad: usize,
    /// The first bad frame and why.
    pub first_bad: Option<(usize, String)>,
}

impl VerifySummary {
    /// The one-line summary.
    pub fn line(&self) -> String {
        match &self.first_bad {
            None => format!(
                "{} frames, {} RoCE ({} CNP): all RoCE frames well-formed, all ICRCs ok",
                self.frames, self.roce, self.cnp
            ),
            Some((n, why)) => format!(
                "{} frames, {} RoCE ({} CNP): {} bad; first: frame {n}: {why}",
                self.frames, self.roce, self.cnp, self.bad
            ),
        }
    }
}

/// Verifies every RoCE frame of a capture.
pub fn verify(data: &[u8]) -> Result<VerifySummary, String> {
    let reader = Reader::new(data).map_err(|e| e.to_string())?;
    let mut s = VerifySummary::default();
    for (i, rec) in reader.enumerate() {
        let rec = rec.map_err(|e| e.to_string())?;
        s.frames += 1;
        let kind = classify(rec.data);
        if !matches!(kind, FrameKind::Roce | FrameKind::Cnp) {
            continue;
        }
        s.roce += 1;
        if kind == FrameKind::Cnp {
            s.cnp += 1;
        }
        if let Err(e) = frame::parse(rec.data) {
            s.bad += 1;
            if s.first_bad.is_none() {
                s.first_bad = Some((i + 1, e.to_string()));
            }
        }
    }
    Ok(s)
}

/// Fills every extended header the opcode calls for with recognisable sample values.
fn sample_transport(op: Opcode, payload_len: usize) -> TransportRepr {
    let info = op.info().expect("sample of a known opcode");
    let mut t = TransportRepr::new(BthRepr::new(op, Qpn::new(0x000123), Psn::new(0xabcdef)));
    t.bth.ack_req = info.needs_ack && info.last;
    for &h in info.headers {
        use roce::wire::opcode::ExtHeader as H;
        match h {
            H::Reth => {
                t.ext.reth = Some(RethRepr {
                    va: 0x7f00_1234_5000,
                    rkey: Rkey(0x1a2b3c),
                    len: payload_len as u32,
                })
            }
            H::AtomicEth => {
                t.ext.atomic_eth = Some(AtomicEthRepr {
                    va: 0x7f00_1234_6000,
                    rkey: Rkey(0x1a2b3c),
                    swap_add: 0x1111,
                    compare: 0x2222,
                })
            }
            H::Deth => {
                t.ext.deth = Some(DethRepr {
                    qkey: Qkey(0x1111_1111),
                    src_qp: Qpn::new(0x456),
                    resv: 0,
                })
            }
            H::Feth => t.ext.feth = Some(FethRepr { raw: 0x11 }),
            H::ImmDt => t.ext.imm = Some(ImmRepr { imm: 0xdead_beef }),
            H::Ieth => {
                t.ext.ieth = Some(IethRepr {
                    rkey: Rkey(0x1a2b3c),
                })
            }
            H::Aeth => {
                t.ext.aeth = Some(match op.0 {
                    0x11 => AethRepr::nak(NakCode::PsnSequenceError, Msn::new(7)),
                    _ => AethRepr::ack(31, Msn::new(7)),
                })
            }
            H::AtomicAckEth => {
                t.ext.atomic_ack = Some(AtomicAckEthRepr {
                    orig: 0x0123_4567_89ab_cdef,
                })
            }
            H::CnpBody => t.ext.cnp = Some(CnpRepr::default()),
        }
    }
    if op == Opcode::CNP {
        t.bth.becn = true;
        t.bth.psn = Psn::new(0);
    }
    t
}

/// The L2/L3 variants `gen` writes: (name, IPv6?, VLAN?).
pub const GEN_VARIANTS: [(&str, bool, bool); 4] = [
    ("ipv4", false, false),
    ("ipv6", true, false),
    ("vlan-ipv4", false, true),
    ("vlan-ipv6", true, true),
];

/// Sample frames: every opcode over every variant, then a PFC, a PAUSE and an ARP request.
pub fn gen_frames() -> Vec<Vec<u8>> {
    let mac_a = [0x02, 0, 0, 0x99, 0, 0x03];
    let mac_b = [0x02, 0, 0, 0x99, 0, 0x04];
    let mut out = Vec::new();
    for (vi, &(_, v6, vlan)) in GEN_VARIANTS.iter().enumerate() {
        for (oi, info) in OPCODES.iter().enumerate() {
            let op = Opcode(info.opcode);
            // Payload sizes cycle through every pad count.
            let plen = if info.has_payload {
                if info.op == roce::wire::opcode::Operation::AtomicWrite {
                    8
                } else {
                    29 + oi % 4
                }
            } else {
                0
            };
            let payload: Vec<u8> = (0..plen).map(|i| (i + oi) as u8).collect();
            let ip = if v6 {
                IpRepr::V6(Ipv6Repr {
                    src: Gid::link_local_from_mac(mac_a).0,
                    dst: Gid::link_local_from_mac(mac_b).0,
                    dscp: 26,
                    ecn: Ecn::Ect0,
                    flow_label: 0x5_0000 + oi as u32,
                    next_header: 17,
                    hop_limit: 64,
                    payload_len: 0,
                })
            } else {
                IpRepr::V4(Ipv4Repr {
                    src: [10, 99, 0, 3],
                    dst: [10, 99, 0, 4],
                    dscp: if op == Opcode::CNP { 48 } else { 26 },
                    ecn: Ecn::Ect0,
                    ident: (vi * 100 + oi) as u16,
                    dont_frag: true,
                    ttl: 64,
                    protocol: 17,
                    payload_len: 0,
                })
            };
            let repr = FrameRepr {
                eth: EthernetRepr {
                    dst: mac_b,
                    src: mac_a,
                    vlan: vlan.then_some(VlanTag {
                        pcp: if op == Opcode::CNP { 6 } else { 3 },
                        dei: false,
                        vid: 99,
                    }),
                    ethertype: 0,
                },
                ip,
                udp_src_port: 0xc000 | (oi as u16),
                udp_checksum: 0,
                transport: sample_transport(op, plen),
            };
            let mut buf = vec![0u8; repr.frame_len(plen).expect("known opcode")];
            repr.emit(&mut buf, &payload).expect("sample frame fits");
            out.push(buf);
        }
    }
    let mac_ctl = |m: MacControlRepr| {
        let mut f = vec![0u8; 60];
        EthernetRepr {
            dst: mac_control::PAUSE_DST,
            src: mac_a,
            vlan: None,
            ethertype: ethernet::ethertype::MAC_CONTROL,
        }
        .emit(&mut f)
        .expect("fits");
        m.emit(&mut f[14..]).expect("fits");
        f
    };
    out.push(mac_ctl(MacControlRepr::Pfc {
        class_enable: 1 << 3,
        quanta: [0, 0, 0, 0xffff, 0, 0, 0, 0],
    }));
    out.push(mac_ctl(MacControlRepr::Pause { quanta: 0x2000 }));
    {
        use roce::wire::arp::{ArpOperation, ArpPacket, ArpRepr, EthernetAddress};
        let mut f = vec![0u8; 60];
        EthernetRepr {
            dst: [0xff; 6],
            src: mac_a,
            vlan: None,
            ethertype: ethernet::ethertype::ARP,
        }
        .emit(&mut f)
        .expect("fits");
        ArpRepr::EthernetIpv4 {
            operation: ArpOperation::Request,
            source_hardware_addr: EthernetAddress(mac_a),
            source_protocol_addr: [10, 99, 0, 3].into(),
            target_hardware_addr: EthernetAddress([0; 6]),
            target_protocol_addr: [10, 99, 0, 4].into(),
        }
        .emit(&mut ArpPacket::new_unchecked(&mut f[14..42]));
        out.push(f);
    }
    out
}

/// Writes frames to a pcap (1 ms apart).
pub fn write_pcap(path: &std::path::Path, frames: &[Vec<u8>]) -> std::io::Result<()> {
    let file = std::io::BufWriter::new(std::fs::File::create(path)?);
    let mut w = Writer::new(file)?;
    for (i, f) in frames.iter().enumerate() {
        w.write(i as u64 * 1_000_000, f)?;
    }
    w.into_inner()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_frames_decode_and_verify() {
        let frames = gen_frames();
        assert_eq!(frames.len(), 4 * OPCODES.len() + 3);
        for (i, f) in frames.iter().enumerate() {
            let v = decode_json(i + 1, f);
            assert!(v.get("error").is_none(), "{v}");
            if i < 4 * OPCODES.len() {
                assert_eq!(v["icrc"], "ok");
                assert_eq!(v["opcode"], OPCODES[i % OPCODES.len()].opcode);
            }
            assert!(!decode_line(&v).is_empty());
        }
        let pfc = decode_json(1, &frames[4 * OPCODES.len()]);
        assert_eq!(pfc["kind"], "pfc");
        assert_eq!(pfc["class_enable"], 8);
        assert_eq!(pfc["quanta"][3], 65535);
        assert_eq!(decode_json(1, frames.last().unwrap())["kind"], "arp");
    }

    #[test]
    fn bad_frames_are_reported_not_fatal() {
        let mut f = gen_frames()[4].clone();
        let n = f.len();
        f[n - 1] ^= 1;
        let v = decode_json(3, &f);
        assert_eq!(v["icrc"], "bad");
        let mut g = gen_frames()[4].clone();
        g.truncate(45);
        let v = decode_json(4, &g);
        assert!(v["error"].as_str().unwrap().contains("IP length"), "{v}");
        assert!(decode_line(&v).contains("malformed"));
    }
}
