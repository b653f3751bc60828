#!/usr/bin/env python3
"""A hostile RoCEv2 peer for ferroce's tests, built with scapy (independent of ferroce's own
frame builder and ICRC).

  hostile_peer.py PARAMS.json OUT.pcap

PARAMS.json names the RNIC under test and the peer (MAC, IPv4) and lists cases, each with
the QP it targets on the RNIC (dqpn), the PSN that QP expects next (psn) and one of its
memory regions (va, rkey, len). For each case, in order, this writes the case's frames to
OUT.pcap and prints one JSON line: {"case": NAME, "frames": COUNT}. What each case sends is
described beside it below; what the RNIC must do about it is checked by tests/tests/hostile.rs.
"""
import json
import struct
import sys

from scapy.all import ARP, Ether, IP, UDP, Raw, raw
from scapy.contrib.roce import BTH

# RC opcodes (IBA 9.2, table 38).
WRITE_FIRST, WRITE_MIDDLE, WRITE_ONLY = 0x06, 0x07, 0x0A
READ_REQUEST, FETCH_ADD = 0x0C, 0x14


def reth(va, rkey, length):
    return struct.pack("!QII", va & 0xFFFFFFFFFFFFFFFF, rkey & 0xFFFFFFFF, length)


def main(params_path, out_path):
    p = json.load(open(params_path))
    ours, peer = p["ours"], p["peer"]
    frames = []

    def roce(case, opcode, psn, payload, src_ip=None, dqpn=None, ackreq=1):
        return (
            Ether(src=peer["mac"], dst=ours["mac"])
            / IP(src=src_ip or peer["ip"], dst=ours["ip"], flags="DF", ttl=64)
            / UDP(sport=0xC000 | (case["dqpn"] & 0x3FFF), dport=4791, chksum=0)
            / BTH(opcode=opcode, dqpn=case["dqpn"] if dqpn is None else dqpn,
                  psn=psn & 0xFFFFFF, ackreq=ackreq)
            / Raw(payload)
        )

    def write_only(case, va, length, data, psn=None, **kw):
        psn = case["psn"] if psn is None else psn
        return roce(case, WRITE_ONLY, psn, reth(va, case["rkey"], length) + data, **kw)

    def build(case):
        name, va, n, psn = case["name"], case["va"], case["len"], case["psn"]
        data = bytes([0xA5]) * 64
        if name == "arp":
            # The peer announces itself (who-has the RNIC's address, from the peer).
            return [Ether(src=peer["mac"], dst="ff:ff:ff:ff:ff:ff")
                    / ARP(op=1, hwsrc=peer["mac"], psrc=peer["ip"], pdst=ours["ip"])]
        if name == "write_past_end":
            # 64 bytes from 16 bytes before the end of the region.
            return [write_only(case, va + n - 16, 64, data)]
        if name == "write_va_wraps":
            # VA + length overflows 64 bits.
            return [write_only(case, 0xFFFFFFFFFFFFFFE0, 64, data)]
        if name == "write_bad_rkey":
            # The right region's index with another key byte (a guess at a stale or
            # neighbouring key).
            return [roce(case, WRITE_ONLY, psn, reth(va, case["rkey"] ^ 0xFF, 64) + data)]
        if name == "write_length_mismatch":
            # RETH says 128 bytes, the only packet carries 64.
            return [roce(case, WRITE_ONLY, psn, reth(va, case["rkey"], 128) + data)]
        if name == "write_middle_without_first":
            return [roce(case, WRITE_MIDDLE, psn, bytes(1024))]
        if name == "write_first_then_only":
            # A new message before the last one ended (IBA C9-34: an opcode sequence error).
            first = roce(case, WRITE_FIRST, psn, reth(va, case["rkey"], 4096) + bytes(1024), ackreq=0)
            return [first, write_only(case, va, 64, data, psn=psn + 1)]
        if name == "psn_far_ahead":
            # Three requests 1000 PSNs ahead: one NAK for the sequence error, no data.
            return [write_only(case, va, 64, data, psn=psn + 1000 + i) for i in range(3)]
        if name == "bad_icrc_flood":
            # 300 in-bounds WRITEs at the expected PSN with a wrong ICRC, then a good one.
            out = []
            for i in range(300):
                f = write_only(case, va, 64, bytes([i & 0xFF]) * 64)
                b = bytearray(raw(f))
                b[-1] ^= 0x01
                out.append(bytes(b))
            out.append(write_only(case, va + 128, 64, data))
            return out
        if name == "read_replayed":
            # A READ of 256 bytes, then the same request three times more (duplicates):
            # each answered again from memory (IBA 9.7.5.1.2), none counted as new.
            req = roce(case, READ_REQUEST, psn, reth(va, case["rkey"], 256))
            return [req] * 4
        if name == "atomic_replayed":
            # FETCH_ADD 5 at the region's start, then the same request twice: the saved
            # original value comes back each time, the add happens once (IBA 9.7.5.2.2).
            aeth = struct.pack("!QIQQ", va, case["rkey"], 5, 0)
            req = roce(case, FETCH_ADD, psn, aeth)
            return [req] * 3
        if name == "spoofed_source":
            # A valid WRITE for the QP from an address that is not its peer's.
            return [write_only(case, va, 64, data, src_ip="10.99.0.9")]
        if name == "unknown_qp":
            return [write_only(case, va, 64, data, dqpn=0xABCDE)]
        if name == "malformed":
            good = raw(write_only(case, va, 64, data))
            out = []
            # Cut inside the BTH, and just after it.
            out.append(good[:14 + 20 + 8 + 6])
            out.append(good[:14 + 20 + 8 + 12])
            # The IPv4 header checksum wrong.
            b = bytearray(good)
            b[14 + 10] ^= 0xFF
            out.append(bytes(b))
            # IPv4 total length past the frame's end.
            b = bytearray(good)
            struct.pack_into("!H", b, 14 + 2, len(good))
            out.append(bytes(b))
            # UDP length past the IP payload.
            b = bytearray(good)
            struct.pack_into("!H", b, 14 + 20 + 4, 4000)
            out.append(bytes(b))
            # BTH transport version 1 (only 0 is defined), ICRC recomputed.
            f = write_only(case, va, 64, data)
            f[BTH].version = 1
            out.append(f)
            # An IPv4 fragment of a RoCE packet (RoCEv2 packets are never fragmented).
            f = write_only(case, va, 64, data)
            f[IP].flags = "MF"
            out.append(f)
            return out
        if name == "control":
            return [write_only(case, va + 256, 64, data)]
        raise SystemExit("unknown case " + name)

    for case in p["cases"]:
        fs = [f if isinstance(f, bytes) else raw(f) for f in build(case)]
        frames.extend(fs)
        print(json.dumps({"case": case["name"], "frames": len(fs)}))
    # A classic pcap, written here so that no frame is dissected and rebuilt on the way.
    with open(out_path, "wb") as out:
        out.write(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1))
        for f in frames:
            out.write(struct.pack("<IIII", 0, 0, len(f), len(f)))
            out.write(f)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    main(sys.argv[1], sys.argv[2])
