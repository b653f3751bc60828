//! The wire layer against real traffic: every RoCE frame that two Linux Soft-RoCE stacks
//! exchanged (tests/corpus, copied from shared/corpus) must parse, verify its ICRC, decode to
//! the fields tshark's independent dissector reports, and re-emit byte-identically from the
//! parsed headers and payload.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use roce::pcap::Reader;
use roce::wire::frame::{self, classify, FrameKind, IpRepr, ParsedFrame};

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/corpus")
}

fn corpus_files() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(corpus_dir())
        .expect("tests/corpus")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "pcap"))
        .collect();
    v.sort();
    assert!(v.len() >= 18, "corpus incomplete: {v:?}");
    v
}

const TSHARK_FIELDS: &[&str] = &[
    "frame.number",
    "infiniband.bth.opcode",
    "infiniband.bth.destqp",
    "infiniband.bth.psn",
    "infiniband.bth.a",
    "infiniband.bth.se",
    "infiniband.bth.m",
    "infiniband.bth.padcnt",
    "infiniband.bth.p_key",
    "infiniband.aeth.syndrome",
    "infiniband.aeth.msn",
    "infiniband.reth.va",
    "infiniband.reth.r_key",
    "infiniband.reth.dmalen",
    "infiniband.deth.q_key",
    "infiniband.deth.srcqp",
    "infiniband.atomiceth.swapdt",
    "infiniband.atomiceth.cmpdt",
    "infiniband.atomicacketh.origremdt",
    "infiniband.invariant.crc",
    "udp.srcport",
    "ip.dsfield.dscp",
    "ip.ttl",
    "ip.id",
];

/// tshark's view of every frame: frame number -> the fields above joined by '|'.
fn tshark(path: &Path) -> HashMap<usize, String> {
    let mut cmd = Command::new("tshark");
    cmd.arg("-r")
        .arg(path)
        .args([
            "--disable-protocol",
            "rpcordma",
            "--disable-protocol",
            "tftp",
        ])
        .args(["-T", "fields", "-E", "separator=|"]);
    for f in TSHARK_FIELDS {
        cmd.args(["-e", f]);
    }
    let out = cmd
        .output()
        .expect("tshark is needed for this test: run `make deps` (apt-get install tshark)");
    assert!(
        out.status.success(),
        "tshark failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let (n, rest) = l.split_once('|').unwrap();
            (n.parse().unwrap(), rest.to_string())
        })
        .collect()
}

fn opt<T>(v: Option<T>, f: impl Fn(T) -> String) -> String {
    v.map(f).unwrap_or_default()
}

/// Our decode in tshark's formats.
fn ours(p: &ParsedFrame, frame: &[u8]) -> String {
    let r = &p.repr;
    let t = &r.transport;
    let b = &t.bth;
    let e = &t.ext;
    // tshark shows the AtomicETH's VA and R_Key in the RETH fields.
    let (va, rkey, dmalen) = match (e.reth, e.atomic_eth) {
        (Some(x), _) => (
            format!("0x{:016x}", x.va),
            format!("0x{:08x}", x.rkey.0),
            x.len.to_string(),
        ),
        (None, Some(a)) => (
            format!("0x{:016x}", a.va),
            format!("0x{:08x}", a.rkey.0),
            String::new(),
        ),
        _ => Default::default(),
    };
    let (dscp, ttl, id) = match r.ip {
        IpRepr::V4(ip) => (
            ip.dscp.to_string(),
            ip.ttl.to_string(),
            format!("0x{:04x}", ip.ident),
        ),
        IpRepr::V6(_) => Default::default(),
    };
    let icrc = u32::from_be_bytes(frame[p.frame_len - 4..p.frame_len].try_into().unwrap());
    [
        b.opcode.0.to_string(),
        format!("0x{:06x}", b.dest_qp.value()),
        b.psn.value().to_string(),
        (b.ack_req as u8).to_string(),
        (b.se as u8).to_string(),
        (b.migreq as u8).to_string(),
        b.pad_count.to_string(),
        b.pkey.0.to_string(),
        opt(e.aeth, |a| a.syndrome.to_string()),
        opt(e.aeth, |a| a.msn.value().to_string()),
        va,
        rkey,
        dmalen,
        opt(e.deth, |d| format!("0x{:016x}", d.qkey.0)),
        opt(e.deth, |d| format!("0x{:08x}", d.src_qp.value())),
        opt(e.atomic_eth, |a| a.swap_add.to_string()),
        opt(e.atomic_eth, |a| a.compare.to_string()),
        opt(e.atomic_ack, |a| a.orig.to_string()),
        format!("0x{icrc:08x}"),
        r.udp_src_port.to_string(),
        dscp,
        ttl,
        id,
    ]
    .join("|")
}

#[test]
fn every_corpus_frame_parses_verifies_matches_tshark_and_re_emits() {
    let mut total = 0;
    for path in corpus_files() {
        let data = std::fs::read(&path).unwrap();
        let shark = tshark(&path);
        let mut roce = 0;
        for (i, rec) in Reader::new(&data).unwrap().enumerate() {
            let rec = rec.unwrap();
            let f = rec.data;
            let kind = classify(f);
            if !matches!(kind, FrameKind::Roce | FrameKind::Cnp) {
                continue;
            }
            roce += 1;
            let p = frame::parse(f)
                .unwrap_or_else(|e| panic!("{} frame {}: {e}", path.display(), i + 1));
            assert!(p.icrc_ok());
            // Same fields as tshark's dissector.
            let theirs = &shark[&(i + 1)];
            assert_eq!(&ours(&p, f), theirs, "{} frame {}", path.display(), i + 1);
            // Byte-identical re-emission from the parsed headers and payload.
            let mut out = vec![0u8; p.frame_len];
            let n = p.repr.emit(&mut out, p.payload(f)).unwrap();
            assert_eq!(n, p.frame_len);
            assert_eq!(
                &out[..],
                &f[..p.frame_len],
                "{} frame {} re-emit",
                path.display(),
                i + 1
            );
            // Segmented input (split inside the headers and inside the payload) agrees.
            for cut in [7, 40, p.payload_offset + 1] {
                if cut < f.len() {
                    let (a, b) = f.split_at(cut);
                    assert_eq!(frame::parse_segments(&[a, b]).unwrap(), p);
                }
            }
        }
        assert!(roce > 0, "{} has no RoCE frames", path.display());
        total += roce;
    }
    assert!(total > 5000, "only {total} RoCE frames checked");
}

/// Flipping any single bit covered by the ICRC in real frames makes verification fail
/// (sampled frames of every opcode class).
#[test]
fn corrupting_real_frames_is_caught() {
    let mut seen = std::collections::HashSet::new();
    for path in corpus_files() {
        let data = std::fs::read(&path).unwrap();
        for rec in Reader::new(&data).unwrap() {
            let f = rec.unwrap().data;
            let Ok(p) = frame::parse(f) else { continue };
            if !seen.insert(p.repr.transport.bth.opcode) {
                continue;
            }
            let l3 = p.l3_offset;
            let masked = [l3 + 1, l3 + 8, l3 + 10, l3 + 11, l3 + 26, l3 + 27, l3 + 32];
            for i in l3..p.frame_len {
                if masked.contains(&i) {
                    continue;
                }
                let mut b = f.to_vec();
                b[i] ^= 0x10;
                assert!(
                    frame::parse(&b).is_err(),
                    "{}: byte {i} flipped still verifies",
                    path.display()
                );
            }
        }
    }
    assert!(seen.len() >= 15, "opcodes sampled: {seen:?}");
}

/// rxe's rdma_cm exchange (rping): the MADs on QP1 parse as the connection manager's REQ,
/// REP and RTU, then DREQ and DREP, with the QPNs and starting PSNs the connection then used
/// (the corpus notes: REQ QP 0x31 starting at 0x58642a, REP QP 0x38 at 0x8d06b3), the REP and
/// RTU naming the REQ's communication ID, and rdma_cm's TCP port space in the service ID.
#[test]
fn rping_cm_exchange_decodes() {
    use roce::wire::mad::{self, CmMessage, Mad};
    let data = std::fs::read(corpus_dir().join("rping.pcap")).unwrap();
    let mut msgs = Vec::new();
    for rec in Reader::new(&data).unwrap() {
        let f = rec.unwrap().data;
        let Ok(p) = frame::parse(f) else { continue };
        let t = &p.repr.transport;
        let to_gsi =
            t.bth.dest_qp.value() == 1 && t.ext.deth.is_some_and(|d| d.qkey.0 == mad::GSI_QKEY);
        if !to_gsi {
            continue;
        }
        let m = Mad::parse(p.payload(f)).expect("a MAD");
        assert_eq!((m.header.base_version, m.header.class), (1, mad::CLASS_CM));
        assert_eq!(m.header.method_name(), "send");
        msgs.push(m.cm.expect("a CM message"));
    }
    let names: Vec<&str> = msgs.iter().map(|m| m.name()).collect();
    assert_eq!(&names[..3], ["REQ", "REP", "RTU"], "{names:?}");
    assert!(
        names.contains(&"DREQ") && names.contains(&"DREP"),
        "{names:?}"
    );
    let CmMessage::Req {
        local_comm_id,
        service_id,
        qpn,
        starting_psn,
        transport,
        ..
    } = msgs[0]
    else {
        panic!("{:?}", msgs[0])
    };
    assert_eq!((qpn, starting_psn, transport), (0x31, 0x58642a, 0));
    assert_eq!(mad::rdma_cm_port(service_id).map(|(s, _)| s), Some("tcp"));
    let req_id = local_comm_id;
    let CmMessage::Rep {
        local_comm_id,
        remote_comm_id,
        qpn,
        starting_psn,
        ..
    } = msgs[1]
    else {
        panic!("{:?}", msgs[1])
    };
    assert_eq!(
        (remote_comm_id, qpn, starting_psn),
        (req_id, 0x38, 0x8d06b3)
    );
    let rep_id = local_comm_id;
    assert_eq!(
        msgs[2],
        CmMessage::Rtu {
            local_comm_id: req_id,
            remote_comm_id: rep_id
        },
        "the RTU comes from the REQ's side and names both IDs"
    );
}

/// Every connection-manager MAD rxe sent (rping, and perftest's `-R` with two connections)
/// parses into the full message and is built again byte for byte: the header and all 232
/// bytes of the message, private data included. This is what lets ferroce's CM answer an
/// unmodified rdma_cm peer exactly as Linux's ib_cm would.
#[test]
fn cm_messages_rebuild_byte_for_byte() {
    use roce::wire::cm::{Cm, CM_DATA_LEN};
    use roce::wire::mad::{self, MadHeader, HEADER_LEN};
    let mut seen = std::collections::BTreeMap::new();
    for case in ["rping.pcap", "write_bw_rdmacm.pcap"] {
        let data = std::fs::read(corpus_dir().join(case)).unwrap();
        for rec in Reader::new(&data).unwrap() {
            let f = rec.unwrap().data;
            let Ok(p) = frame::parse(f) else { continue };
            if p.repr.transport.bth.dest_qp.value() != 1 {
                continue;
            }
            let payload = p.payload(f);
            assert_eq!(payload.len(), mad::MAD_LEN, "{case}: a MAD is 256 bytes");
            let h = MadHeader::parse(payload).unwrap();
            let mut hb = [0u8; HEADER_LEN];
            h.emit(&mut hb);
            assert_eq!(&hb[..], &payload[..HEADER_LEN], "{case}: MAD header");
            let body = &payload[HEADER_LEN..];
            let m = Cm::parse(h.attr_id, body).unwrap().expect("a CM message");
            let mut out = [0u8; CM_DATA_LEN];
            m.emit(&mut out);
            assert_eq!(&out[..], body, "{case}: {m:?}");
            *seen.entry(h.attr_id).or_insert(0) += 1;
        }
    }
    // REQ, REP, RTU, DREQ, DREP: 3 connections in all, 4 disconnections (3 DREQ answered).
    let kinds: Vec<u16> = seen.keys().copied().collect();
    assert_eq!(kinds, [0x10, 0x13, 0x14, 0x15, 0x16], "{seen:?}");
    assert_eq!(seen[&0x10], 3, "{seen:?}");
}

/// rdma_cm's addressing header in rping's REQ: the client 10.99.0.2 (its source port) to
/// the server 10.99.0.4, on the port the service ID names (rping's default 7174); built
/// again, it is the same bytes.
#[test]
fn rping_req_carries_rdma_cm_addresses() {
    use roce::wire::cm::{service_id, Cm, CmaHeader, CMA_HDR_LEN, PS_TCP};
    use roce::wire::mad::{attr, MadHeader, HEADER_LEN};
    let data = std::fs::read(corpus_dir().join("rping.pcap")).unwrap();
    let req = Reader::new(&data)
        .unwrap()
        .find_map(|rec| {
            let f = rec.unwrap().data;
            let p = frame::parse(f).ok()?;
            let mad = p.payload(f);
            let h = MadHeader::parse(mad).ok()?;
            (p.repr.transport.bth.dest_qp.value() == 1 && h.attr_id == attr::REQ)
                .then(|| Cm::parse(h.attr_id, &mad[HEADER_LEN..]).unwrap())
        })
        .flatten()
        .expect("rping's REQ");
    let Cm::Req(req) = req else { panic!() };
    let pd = &req.private_data.0;
    let h = CmaHeader::parse(pd).expect("a CMA header");
    assert_eq!(h.src.ip().to_string(), "10.99.0.2");
    assert_eq!(h.dst.to_string(), "10.99.0.4");
    assert_ne!(h.src.port(), 0);
    assert_eq!(req.service_id, service_id(PS_TCP, 7174));
    let mut again = [0u8; CMA_HDR_LEN];
    assert!(h.emit(&mut again));
    assert_eq!(&again[..], &pd[..CMA_HDR_LEN]);
    // The whole private data as rdma_cm builds it (rping adds no bytes of its own), and
    // user bytes that do not fit after the header refused.
    assert_eq!(h.private_data::<92>(&[]).unwrap().0, *pd);
    assert!(h.private_data::<92>(&[0; 57]).is_none());
    assert_eq!(
        &h.private_data::<92>(b"ab").unwrap().0[CMA_HDR_LEN..CMA_HDR_LEN + 3],
        b"ab\0"
    );
}
