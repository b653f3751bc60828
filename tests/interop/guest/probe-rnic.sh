#!/bin/sh
# Guest side of the host-attachment check (see afpacket_probe.py): talk to 10.99.0.3, where
# ferroce (or the probe standing in for it) sits on the host side of tap0.
# 1. ARP + ICMP: ping must get its 3 replies.
ping -c 3 -W 3 10.99.0.3; echo "probe ping rc=$?"
ip neigh show dev eth0
# 2. One real RoCEv2 exchange attempt: rping's rdma_cm sends a CM REQ (a MAD on QP1, UDP 4791)
#    to 10.99.0.3. Nobody answers it in this check; it only shows the frame's shape.
timeout 6 rping -c -a 10.99.0.3 -C 1 >/dev/null 2>&1; echo "probe rping done"
# 3. The host kernel's own address, for comparison (perftest's TCP exchange goes there).
ping -c 1 -W 3 10.99.0.1; echo "probe ping-host rc=$?"
# Link MTU and rxe's path MTU.
cat /sys/class/net/eth0/mtu
ibv_devinfo -d rxe0 | grep active_mtu
cat /sys/class/infiniband/rxe0/ports/1/hw_counters/sent_pkts
