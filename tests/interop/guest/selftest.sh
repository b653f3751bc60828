#!/bin/sh
# Guest-side smoke test, no host peer involved: rxe0 talks to itself (ib_write_bw server and
# client both in the guest, over the guest's own 10.99.0.2).
ibv_devinfo -d rxe0 | grep -E 'state|active_mtu'
rdma link show
ib_write_bw -d rxe0 -x 1 -s 65536 -n 200 -F >/tmp/server.txt 2>&1 &
sleep 1
ib_write_bw -d rxe0 -x 1 -s 65536 -n 200 -F 10.99.0.2
rc=$?
echo "selftest ib_write_bw rc=$rc"
wait
tail -3 /tmp/server.txt
exit $rc
