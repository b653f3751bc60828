#!/usr/bin/env python3
"""scapy as an independent RoCEv2 implementation for ferroce's wire tests.

  scapy_roce.py check FILE.pcap   recompute the ICRC of every RoCE frame with scapy's
                                  scapy.contrib.roce and print "ok N" or "mismatch ..." lines
  scapy_roce.py gen FILE.pcap     build frames with scapy (IPv6, VLAN, ECN, imm, DETH...) and
                                  print one JSON object per frame with the values used
"""
import json
import struct
import sys

from scapy.all import Ether, Dot1Q, IP, IPv6, UDP, Raw, rdpcap, wrpcap, raw
from scapy.contrib.roce import BTH, AETH, cnp


def check(path):
    ok = bad = 0
    for i, p in enumerate(rdpcap(path), 1):
        if BTH not in p:
            continue
        orig = raw(p)
        q = p.copy()
        q[BTH].icrc = None
        rebuilt = raw(q)
        if rebuilt == orig:
            ok += 1
        else:
            bad += 1
            print("mismatch frame %d: ours %s scapy %s" % (i, orig[-4:].hex(), rebuilt[-4:].hex()))
    print("ok %d" % ok)
    return 1 if bad or ok == 0 else 0


def gen(path):
    frames, meta = [], []
    mac_a, mac_b = "02:00:00:99:00:03", "02:00:00:99:00:04"
    v6a, v6b = "fe80::ff:fe99:3", "fe80::ff:fe99:4"

    def add(pkt, **m):
        frames.append(pkt)
        meta.append(m)

    # IPv6 RC SEND ONLY, 13-byte payload (pad 3), ECN CE, flow label set.
    pay = bytes(range(13))
    add(Ether(src=mac_a, dst=mac_b) / IPv6(src=v6a, dst=v6b, tc=(26 << 2) | 3, fl=0x12345, hlim=7)
        / UDP(sport=0xc001, dport=4791, chksum=0)
        / BTH(opcode=0x04, dqpn=0x11, psn=0xfffffe, ackreq=1, padcount=3) / Raw(pay + b"\0\0\0"),
        opcode=0x04, dqpn=0x11, psn=0xfffffe, ipv6=True, vlan=None, dscp=26, ecn="ce",
        payload=pay.hex(), pad=3)
    # VLAN PCP 3 / IPv4 RC RDMA WRITE ONLY with RETH.
    pay = bytes([0xa5] * 64)
    reth = struct.pack("!QII", 0x7f0012345000, 0x1234, len(pay))
    add(Ether(src=mac_a, dst=mac_b) / Dot1Q(prio=3, vlan=100) / IP(src="10.99.0.3", dst="10.99.0.4", tos=26 << 2 | 2, flags="DF", id=77)
        / UDP(sport=0xc002, dport=4791, chksum=0)
        / BTH(opcode=0x0a, dqpn=0x22, psn=5, ackreq=1) / Raw(reth + pay),
        opcode=0x0a, dqpn=0x22, psn=5, ipv6=False, vlan=[3, 100], dscp=26, ecn="ect0",
        payload=pay.hex(), pad=0, reth=[0x7f0012345000, 0x1234, 64])
    # VLAN / IPv6 RC ACK carrying an RNR NAK (scapy's AETH layer).
    add(Ether(src=mac_b, dst=mac_a) / Dot1Q(prio=5, vlan=7) / IPv6(src=v6b, dst=v6a)
        / UDP(sport=0xc003, dport=4791, chksum=0)
        / BTH(opcode=0x11, dqpn=0x33, psn=9) / AETH(syndrome=0x2e, msn=0x123456),
        opcode=0x11, dqpn=0x33, psn=9, ipv6=True, vlan=[5, 7], dscp=0, ecn="not-ect",
        payload="", pad=0, aeth=[0x2e, 0x123456])
    # IPv6 CNP (scapy's helper), DSCP 48 on priority 6.
    add(Ether(src=mac_b, dst=mac_a) / Dot1Q(prio=6, vlan=7) / IPv6(src=v6b, dst=v6a, tc=48 << 2)
        / UDP(sport=0, dport=4791, chksum=0) / cnp(0x44),
        opcode=0x81, dqpn=0x44, psn=0, ipv6=True, vlan=[6, 7], dscp=48, ecn="not-ect",
        payload="", pad=0)
    # IPv6 UD SEND ONLY WITH IMMEDIATE: DETH + ImmDt, 7-byte payload (pad 1).
    pay = b"ferroce"
    deth = struct.pack("!II", 0x11111111, 0x000456)
    imm = struct.pack("!I", 0xcafef00d)
    add(Ether(src=mac_a, dst=mac_b) / IPv6(src=v6a, dst=v6b)
        / UDP(sport=0xc004, dport=4791, chksum=0)
        / BTH(opcode=0x65, dqpn=0x55, psn=0x1000, padcount=1) / Raw(deth + imm + pay + b"\0"),
        opcode=0x65, dqpn=0x55, psn=0x1000, ipv6=True, vlan=None, dscp=0, ecn="not-ect",
        payload=pay.hex(), pad=1, deth=[0x11111111, 0x456], imm=0xcafef00d)
    # IPv4 atomic compare-and-swap with FECN set by a "switch" (masked in the ICRC).
    aeth = struct.pack("!QIQQ", 0x1000, 0x99, 5, 6)
    add(Ether(src=mac_a, dst=mac_b) / IP(src="10.99.0.3", dst="10.99.0.4", flags="DF")
        / UDP(sport=0xc005, dport=4791, chksum=0)
        / BTH(opcode=0x13, dqpn=0x66, psn=0x20, ackreq=1, fecn=1) / Raw(aeth),
        opcode=0x13, dqpn=0x66, psn=0x20, ipv6=False, vlan=None, dscp=0, ecn="not-ect",
        payload="", pad=0, atomic=[0x1000, 0x99, 5, 6], fecn=True)
    wrpcap(path, frames)
    for m in meta:
        print(json.dumps(m))
    return 0


if __name__ == "__main__":
    cmd, path = sys.argv[1], sys.argv[2]
    sys.exit(check(path) if cmd == "check" else gen(path))
