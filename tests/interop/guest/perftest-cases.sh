#!/bin/sh
# Guest side of the rnic-perf interop test (tools/tests/interop.rs): runs the unmodified perftest
# and rdma-core tools once per line of /mnt/share/cases.txt, against ferroce on the host side of
# tap0, and prints each tool's output framed by markers the test parses.
#
# cases.txt lines: ID ROLE TOOL ARGS...
#   ROLE client: the guest tool is the client; ferroce's rnic-perf serves its TCP exchange on the
#                host kernel's 10.99.0.1 (its RDMA address is 10.99.0.3, learned from its keys).
#                ferroce may not listen yet, so the tool is retried while it cannot connect.
#   ROLE server: the guest tool is the server; rnic-perf connects to 10.99.0.2.
#   ROLE ping:   TOOL is an address; the guest waits (up to 60 s) until it answers one ping,
#                then sends three more and shows the neighbour entry it learned by ARP.
#   ROLE cm-server: an rdma_cm program (rping, ucmatose) run as given (its addresses are in
#                ARGS). When the host writes /mnt/share/restart.ID, the server is killed and
#                started again, and /mnt/share/restarted.ID says so; /mnt/share/ended.ID says
#                the case is over (no more restarts). Debian's perftest (4.5-0.17)
#                cannot retry its data connection's REQ when the server does not listen yet
#                (fixed upstream in perftest 3d9d8d0), and a server left waiting for that
#                connection would take the host client's next try for it.
#   ROLE cm-client: the same as a client: retried while its request is rejected (ferroce's
#                end may not listen yet).
# Around every case the rxe0 error counters are printed, so the test can check that none moved.

CNT=/sys/class/infiniband/rxe0/ports/1/hw_counters
snap() {
  for f in rcvd_seq_err retry_exceeded_err retry_rnr_exceeded_err out_of_seq_request \
           duplicate_request completer_retry_err rcvd_pkts sent_pkts; do
    printf '%s=%s ' "$f" "$(cat $CNT/$f 2>/dev/null || echo NA)"
  done
}

while read -r id role tool args; do
  [ -z "$id" ] && continue
  echo "=== case $id $role $tool $args"
  echo "counters-before $id $(snap)"
  if [ "$role" = ping ]; then
    tries=0
    until ping -c 1 -W 1 "$tool" >/dev/null 2>&1 || [ $tries -ge 60 ]; do tries=$((tries + 1)); done
    ping -c 3 -W 2 "$tool" >/tmp/out.$id 2>&1
    rc=$?
    ip neigh show "$tool" >>/tmp/out.$id 2>&1
  elif [ "$role" = cm-client ]; then
    tries=0
    while :; do
      timeout 60 $tool $args >/tmp/out.$id 2>&1
      rc=$?
      if [ $rc -ne 0 ] && grep -qE "REJECTED|UNREACHABLE|Connection refused|Unexpected CM event" /tmp/out.$id && [ $tries -lt 90 ]; then
        tries=$((tries + 1))
        sleep 1
        continue
      fi
      break
    done
  elif [ "$role" = client ]; then
    tries=0
    while :; do
      timeout 120 $tool $args 10.99.0.1 >/tmp/out.$id 2>&1
      rc=$?
      if [ $rc -ne 0 ] && grep -q "Couldn't connect" /tmp/out.$id && [ $tries -lt 90 ]; then
        tries=$((tries + 1))
        sleep 1
        continue
      fi
      break
    done
  elif [ "$role" = cm-server ]; then
    share=/mnt/share
    # (restart.ID is not cleared here: the host may ask before this case starts; it clears
    # what an earlier run left before its first try.)
    rm -f $share/restarted.$id $share/ended.$id
    restarts=0
    while :; do
      timeout 120 $tool $args >/tmp/out.$id 2>&1 &
      pid=$!
      # A restart is acknowledged once the new server runs.
      [ $restarts -gt 0 ] && touch $share/restarted.$id
      while kill -0 $pid 2>/dev/null && [ ! -e $share/restart.$id ]; do
        sleep 0.2 2>/dev/null || sleep 1
      done
      if [ -e $share/restart.$id ] && [ $restarts -lt 10 ]; then
        rm -f $share/restart.$id
        kill $pid 2>/dev/null
        wait $pid
        restarts=$((restarts + 1))
        echo "restart $id: server started again ($restarts)"
        continue
      fi
      wait $pid
      rc=$?
      break
    done
    # The host stops asking for restarts of this case (a request it made meanwhile is
    # answered by this).
    touch $share/ended.$id
    rm -f $share/restart.$id
  else
    timeout 120 $tool $args >/tmp/out.$id 2>&1
    rc=$?
  fi
  cat /tmp/out.$id
  echo "counters-after $id $(snap)"
  echo "=== end $id rc=$rc"
done </mnt/share/cases.txt
echo "=== all cases done"
