#!/usr/bin/env python3
"""Stand-in for ferroce's host-side attachment, without ferroce.

Opens a raw AF_PACKET socket on tap0 (what DPDK's net_af_packet does), pretends to be the RNIC
at 10.99.0.3 / 02:00:00:99:00:03: answers ARP requests and ICMP echo requests for that address,
and logs every frame it sees (direction, MACs, protocol, length, checksum state). RoCEv2 frames
(UDP port 4791) are decoded far enough to show the BTH opcode and the UDP checksum.

Run it inside the harness namespace while the guest runs, e.g.
    ip netns exec rnic-interop python3 tests/interop/afpacket_probe.py --seconds 60
It stops after --seconds, on SIGTERM/SIGINT, or when --stop-after-echo echo requests were
answered, and prints a one-line JSON summary last (stdout). Only stdlib; needs root.
"""
import argparse
import json
import select
import signal
import socket
import struct
import sys
import time

ETH_P_ALL = 0x0003
SOL_PACKET = 263
PACKET_ADD_MEMBERSHIP = 1
PACKET_MR_PROMISC = 1
PACKET_AUXDATA = 8
PACKET_QDISC_BYPASS = 20
TP_STATUS_CSUMNOTREADY = 0x8
TP_STATUS_CSUM_VALID = 0x80
PKTTYPE = {0: "host", 1: "broadcast", 2: "multicast", 3: "otherhost", 4: "outgoing"}


def mac_str(b):
    return ":".join(f"{x:02x}" for x in b)


def mac_bytes(s):
    return bytes(int(x, 16) for x in s.split(":"))


def inet_csum(data):
    if len(data) % 2:
        data += b"\0"
    s = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return (~s) & 0xFFFF


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iface", default="tap0")
    ap.add_argument("--ip", default="10.99.0.3")
    ap.add_argument("--mac", default="02:00:00:99:00:03")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--no-arp", action="store_true", help="do not answer ARP")
    ap.add_argument("--no-echo", action="store_true", help="do not answer ICMP echo")
    ap.add_argument("--promisc", action="store_true", help="put the interface in promiscuous mode")
    ap.add_argument("--qdisc-bypass", action="store_true",
                    help="set PACKET_QDISC_BYPASS, as DPDK's net_af_packet does by default")
    ap.add_argument("--stop-after-echo", type=int, default=0,
                    help="exit once this many echo requests were answered (0: run --seconds)")
    ap.add_argument("--quiet", action="store_true", help="no per-frame log")
    args = ap.parse_args()

    my_ip = socket.inet_aton(args.ip)
    my_mac = mac_bytes(args.mac)

    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    s.bind((args.iface, 0))
    s.setsockopt(SOL_PACKET, PACKET_AUXDATA, 1)
    if args.qdisc_bypass:
        s.setsockopt(SOL_PACKET, PACKET_QDISC_BYPASS, 1)
    if args.promisc:
        ifindex = socket.if_nametoindex(args.iface)
        mreq = struct.pack("iHH8s", ifindex, PACKET_MR_PROMISC, 0, b"")
        s.setsockopt(SOL_PACKET, PACKET_ADD_MEMBERSHIP, mreq)

    stats = {"frames": 0, "by_pkttype": {}, "arp_requests_for_us": 0, "arp_replies_sent": 0,
             "echo_requests_for_us": 0, "echo_replies_sent": 0, "roce_frames": 0,
             "roce_udp_csum_zero": 0, "csum_not_ready": 0, "max_frame_len": 0,
             "frames_over_1514": 0, "guest_macs": []}
    stop = [False]

    def on_signal(*_):
        stop[0] = True
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    def log(msg):
        if not args.quiet:
            print(f"{time.monotonic() - t0:8.3f} {msg}", flush=True)

    def send(frame, what):
        # Pad to the Ethernet minimum (60 bytes without FCS) like a NIC would.
        s.send(frame.ljust(60, b"\0"))
        log(f"TX {what}")

    t0 = time.monotonic()
    deadline = t0 + args.seconds
    while not stop[0]:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        try:
            r, _, _ = select.select([s], [], [], min(left, 0.5))
        except InterruptedError:
            continue
        if not r:
            continue
        frame, anc, _flags, addr = s.recvmsg(65536, socket.CMSG_SPACE(32))
        pkttype = PKTTYPE.get(addr[2], str(addr[2]))
        status = 0
        for level, typ, data in anc:
            if level == SOL_PACKET and typ == PACKET_AUXDATA:
                status = struct.unpack_from("I", data)[0]
        stats["frames"] += 1
        stats["by_pkttype"][pkttype] = stats["by_pkttype"].get(pkttype, 0) + 1
        stats["max_frame_len"] = max(stats["max_frame_len"], len(frame))
        if len(frame) > 1514:
            stats["frames_over_1514"] += 1
        if status & TP_STATUS_CSUMNOTREADY:
            stats["csum_not_ready"] += 1
        if len(frame) < 14:
            continue
        dst, src, etype = frame[0:6], frame[6:12], struct.unpack("!H", frame[12:14])[0]
        csum = ("partial" if status & TP_STATUS_CSUMNOTREADY else
                "valid" if status & TP_STATUS_CSUM_VALID else "-")
        head = f"RX {pkttype:9} {mac_str(src)} > {mac_str(dst)} len {len(frame)} csum {csum}"
        if pkttype == "outgoing":
            log(head + " (sent by this host's stack or by us)")
            continue
        if src[0:3] == b"\x52\x54\x00" and mac_str(src) not in stats["guest_macs"]:
            stats["guest_macs"].append(mac_str(src))

        if etype == 0x0806 and len(frame) >= 42:
            op = struct.unpack("!H", frame[20:22])[0]
            sha, spa, tpa = frame[22:28], frame[28:32], frame[38:42]
            log(head + f" ARP op {op} who-has {socket.inet_ntoa(tpa)} tell {socket.inet_ntoa(spa)}")
            if op == 1 and tpa == my_ip:
                stats["arp_requests_for_us"] += 1
                if not args.no_arp:
                    reply = (sha + my_mac + b"\x08\x06" +
                             struct.pack("!HHBBH", 1, 0x0800, 6, 4, 2) +
                             my_mac + my_ip + sha + spa)
                    send(reply, f"ARP reply {args.ip} is-at {args.mac}")
                    stats["arp_replies_sent"] += 1
            continue
        if etype != 0x0800 or len(frame) < 34:
            log(head + f" ethertype 0x{etype:04x}")
            continue
        ihl = (frame[14] & 0x0F) * 4
        proto = frame[23]
        sip, dip = frame[26:30], frame[30:34]
        l4 = 14 + ihl
        ipdesc = f" IPv4 {socket.inet_ntoa(sip)} > {socket.inet_ntoa(dip)} proto {proto}"
        if proto == 1 and len(frame) >= l4 + 8:
            icmp_type = frame[l4]
            log(head + ipdesc + f" ICMP type {icmp_type}")
            if icmp_type == 8 and dip == my_ip and dst == my_mac:
                stats["echo_requests_for_us"] += 1
                if not args.no_echo:
                    total = struct.unpack("!H", frame[16:18])[0]
                    icmp = bytearray(frame[l4:14 + total])
                    icmp[0] = 0
                    icmp[2:4] = b"\0\0"
                    icmp[2:4] = struct.pack("!H", inet_csum(bytes(icmp)))
                    ip = bytearray(frame[14:l4])
                    ip[12:16], ip[16:20] = dip, sip
                    ip[8] = 64
                    ip[10:12] = b"\0\0"
                    ip[10:12] = struct.pack("!H", inet_csum(bytes(ip)))
                    send(src + my_mac + b"\x08\x00" + bytes(ip) + bytes(icmp),
                         f"ICMP echo reply to {socket.inet_ntoa(sip)}")
                    stats["echo_replies_sent"] += 1
                    if args.stop_after_echo and stats["echo_replies_sent"] >= args.stop_after_echo:
                        stop[0] = True
            continue
        if proto == 17 and len(frame) >= l4 + 8:
            sport, dport, ulen, ucsum = struct.unpack("!HHHH", frame[l4:l4 + 8])
            desc = f" UDP {sport} > {dport} len {ulen} udp-csum 0x{ucsum:04x}"
            if dport == 4791 and len(frame) >= l4 + 8 + 12:
                stats["roce_frames"] += 1
                if ucsum == 0:
                    stats["roce_udp_csum_zero"] += 1
                bth = frame[l4 + 8:l4 + 20]
                opcode = bth[0]
                dqpn = int.from_bytes(bth[5:8], "big")
                psn = int.from_bytes(bth[9:12], "big") & 0xFFFFFF
                desc += f" RoCEv2 opcode 0x{opcode:02x} dest-qp {dqpn} psn {psn}"
            log(head + ipdesc + desc)
            continue
        log(head + ipdesc)

    s.close()
    print(json.dumps(stats), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
