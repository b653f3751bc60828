//! Property tests of the wire layer: parse(emit(x)) == x over generated frames of every
//! opcode, L2/L3 variant and payload size; and no input, however malformed, panics the parser.

use proptest::prelude::*;
use roce::types::{Msn, Pkey, Psn, Qkey, Qpn, Rkey};
use roce::wire::aeth::AethRepr;
use roce::wire::atomic_ack_eth::AtomicAckEthRepr;
use roce::wire::atomic_eth::AtomicEthRepr;
use roce::wire::bth::BthRepr;
use roce::wire::cnp::CnpRepr;
use roce::wire::deth::DethRepr;
use roce::wire::ethernet::{ethertype, EthernetRepr, VlanTag};
use roce::wire::feth::FethRepr;
use roce::wire::frame::{self, pad_for, FrameRepr, HeaderTemplate, IpRepr, TransportRepr};
use roce::wire::ieth::IethRepr;
use roce::wire::imm::ImmRepr;
use roce::wire::ipv4::{Ecn, Ipv4Repr};
use roce::wire::ipv6::Ipv6Repr;
use roce::wire::opcode::{ExtHeader, Opcode, OPCODES};
use roce::wire::reth::RethRepr;

fn ecn() -> impl Strategy<Value = Ecn> {
    (0u8..4).prop_map(Ecn::from_bits)
}

fn ip() -> impl Strategy<Value = IpRepr> {
    prop_oneof![
        (
            any::<[u8; 4]>(),
            any::<[u8; 4]>(),
            0u8..64,
            ecn(),
            any::<u16>(),
            any::<bool>(),
            any::<u8>()
        )
            .prop_map(
                |(src, dst, dscp, ecn, ident, df, ttl)| IpRepr::V4(Ipv4Repr {
                    src,
                    dst,
                    dscp,
                    ecn,
                    ident,
                    dont_frag: df,
                    ttl,
                    protocol: 17,
                    payload_len: 0,
                })
            ),
        (
            any::<[u8; 16]>(),
            any::<[u8; 16]>(),
            0u8..64,
            ecn(),
            0u32..(1 << 20),
            any::<u8>()
        )
            .prop_map(|(src, dst, dscp, ecn, fl, hl)| IpRepr::V6(Ipv6Repr {
                src,
                dst,
                dscp,
                ecn,
                flow_label: fl,
                next_header: 17,
                hop_limit: hl,
                payload_len: 0,
            })),
    ]
}

prop_compose! {
    fn bth(op: Opcode)(se in any::<bool>(), m in any::<bool>(), pkey in any::<u16>(),
                       fecn in any::<bool>(), becn in any::<bool>(), r6 in 0u8..64,
                       qp in 0u32..(1 << 24), a in any::<bool>(), r7 in 0u8..128,
                       psn in 0u32..(1 << 24)) -> BthRepr {
        BthRepr { opcode: op, se, migreq: m, pad_count: 0, pkey: Pkey(pkey), fecn, becn,
                  resv6: r6, dest_qp: Qpn::new(qp), ack_req: a, resv7: r7, psn: Psn::new(psn) }
    }
}

fn transport() -> impl Strategy<Value = TransportRepr> {
    (0..OPCODES.len()).prop_flat_map(|i| {
        let info = &OPCODES[i];
        (
            bth(Opcode(info.opcode)),
            any::<(u64, u32, u32)>(),
            any::<(u64, u32, u64, u64)>(),
            any::<(u32, u32, u8)>(),
            any::<(u32, u32, u32)>(),
            any::<(u8, u32, u64)>(),
            any::<[u8; 16]>(),
        )
            .prop_map(move |(b, reth, at, deth, misc, ack, cnp)| {
                let mut t = TransportRepr::new(b);
                for &h in info.headers {
                    match h {
                        ExtHeader::Reth => {
                            t.ext.reth = Some(RethRepr {
                                va: reth.0,
                                rkey: Rkey(reth.1),
                                len: reth.2,
                            })
                        }
                        ExtHeader::AtomicEth => {
                            t.ext.atomic_eth = Some(AtomicEthRepr {
                                va: at.0,
                                rkey: Rkey(at.1),
                                swap_add: at.2,
                                compare: at.3,
                            })
                        }
                        ExtHeader::Deth => {
                            t.ext.deth = Some(DethRepr {
                                qkey: Qkey(deth.0),
                                src_qp: Qpn::new(deth.1),
                                resv: deth.2,
                            })
                        }
                        ExtHeader::Feth => t.ext.feth = Some(FethRepr { raw: misc.0 }),
                        ExtHeader::ImmDt => t.ext.imm = Some(ImmRepr { imm: misc.1 }),
                        ExtHeader::Ieth => t.ext.ieth = Some(IethRepr { rkey: Rkey(misc.2) }),
                        ExtHeader::Aeth => {
                            t.ext.aeth = Some(AethRepr {
                                syndrome: ack.0,
                                msn: Msn::new(ack.1),
                            })
                        }
                        ExtHeader::AtomicAckEth => {
                            t.ext.atomic_ack = Some(AtomicAckEthRepr { orig: ack.2 })
                        }
                        ExtHeader::CnpBody => t.ext.cnp = Some(CnpRepr { reserved: cnp }),
                    }
                }
                t
            })
    })
}

prop_compose! {
    fn frame_repr()(dst in any::<[u8; 6]>(), src in any::<[u8; 6]>(),
                    vlan in proptest::option::of((0u8..8, any::<bool>(), 0u16..4096)),
                    ip in ip(), sport in any::<u16>(), csum in any::<u16>(),
                    transport in transport()) -> FrameRepr {
        FrameRepr {
            eth: EthernetRepr {
                dst, src,
                vlan: vlan.map(|(pcp, dei, vid)| VlanTag { pcp, dei, vid }),
                ethertype: 0,
            },
            ip, udp_src_port: sport, udp_checksum: csum, transport,
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn parse_of_emit_is_identity(repr in frame_repr(), len in 0usize..300, seed in any::<u8>()) {
        let info = repr.transport.bth.opcode.info().unwrap();
        let len = if info.has_payload { len } else { 0 };
        let payload: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect();
        let mut buf = vec![0u8; repr.frame_len(len).unwrap()];
        let n = repr.emit(&mut buf, &payload).unwrap();
        prop_assert_eq!(n, buf.len());
        let p = frame::parse(&buf).unwrap();
        let mut expect = repr;
        expect.eth.ethertype = if repr.ip.is_ipv6() { ethertype::IPV6 } else { ethertype::IPV4 };
        expect.transport.bth.pad_count = pad_for(len) as u8;
        let got = p.repr;
        // Lengths are derived: compare everything else.
        let fix_len = |mut r: FrameRepr| {
            match &mut r.ip {
                IpRepr::V4(x) => x.payload_len = 0,
                IpRepr::V6(x) => x.payload_len = 0,
            }
            r
        };
        prop_assert_eq!(fix_len(got), fix_len(expect));
        prop_assert_eq!(p.payload(&buf), &payload[..]);
        // Re-emitting the parsed frame gives the same bytes.
        let mut again = vec![0u8; buf.len()];
        got.emit(&mut again, p.payload(&buf)).unwrap();
        prop_assert_eq!(again, buf);
    }

    #[test]
    fn a_template_builds_the_frame_the_repr_builds(repr in frame_repr(), ident in any::<u16>(),
                                                   len in prop_oneof![0usize..300, 65400usize..65600]) {
        // Any identification and payload length, up to past what the IP length field holds:
        // headers byte for byte the same, or the same error.
        let mut by_repr = repr;
        if let IpRepr::V4(r) = &mut by_repr.ip {
            r.ident = ident;
        }
        let tmpl = HeaderTemplate::new(&repr).unwrap();
        let hlen = by_repr.header_len().unwrap();
        prop_assert_eq!(tmpl.frame_len(&repr.transport, len).unwrap(), by_repr.frame_len(len).unwrap());
        let mut a = vec![0xa5u8; hlen];
        let mut b = vec![0x5au8; hlen];
        let ra = by_repr.emit_headers(&mut a, len);
        let rb = tmpl.emit_headers(&repr.transport, ident, len, &mut b);
        match (ra, rb) {
            (Ok(n), Ok(layout)) => {
                prop_assert_eq!(n, hlen);
                prop_assert_eq!(layout, by_repr.layout().unwrap());
                prop_assert_eq!(a, b);
            }
            (Err(x), Err(y)) => prop_assert_eq!(x, y),
            (x, y) => prop_assert!(false, "repr {:?}, template {:?}", x, y),
        }
        // Too short a buffer is an error, not a panic.
        let mut short = vec![0u8; hlen - 1];
        prop_assert!(tmpl.emit_headers(&repr.transport, ident, 0, &mut short).is_err());
    }

    #[test]
    fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = frame::inspect(&data);
        let _ = frame::classify(&data);
        let (a, b) = data.split_at(data.len() / 2);
        let _ = frame::inspect_segments(&[a, b]);
    }

    #[test]
    fn mutated_valid_frames_never_panic(repr in frame_repr(), len in 0usize..64,
                                        edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8),
                                        cut in any::<usize>()) {
        let len = if repr.transport.bth.opcode.info().unwrap().has_payload { len } else { 0 };
        let mut buf = vec![0u8; repr.frame_len(len).unwrap()];
        repr.emit(&mut buf, &vec![7u8; len]).unwrap();
        for (at, v) in edits {
            let i = at % buf.len();
            buf[i] = v;
        }
        let cut = cut % (buf.len() + 1);
        let _ = frame::inspect(&buf[..cut]);
        let _ = frame::parse(&buf);
    }
}
