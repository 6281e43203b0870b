#!/usr/bin/env bash
# Runs the NetworkDirect SDK programs built by build.sh: every program (and every ndmemorytest
# case) on 127.0.0.1, server and client as two processes, on each transport, each process under a
# timeout. Prints one line per program x transport and a table at the end; exits non-zero if any
# case failed.
#
#   tests/ms-sdk/run.sh <programs dir> [iwarp] [roce]      (both transports if none is named)
#
# ndmpic's two processes (MPI ranks) each listen on, and bind their connectors to, ports of their
# own address that the program fixes; two hosts in its design, 127.0.0.1 and 127.0.0.2 here.
# A case passes when every process of it exits 0 within its time. Each case's output is kept in
# <programs dir>/runs/<transport>.<case>.{server,client,single}.log. MS_SDK_ONLY="regex" runs the
# cases whose names match. The ports are below the kernel's ephemeral range, except ndmpic's,
# which the program fixes (54322-54330).
set -uo pipefail
if [ $# -lt 1 ]; then
  echo "usage: $0 <programs dir> [iwarp] [roce]" >&2
  exit 2
fi
bin=$(cd "$1" && pwd)
shift
transports=("$@")
[ ${#transports[@]} -eq 0 ] && transports=(iwarp roce)
runs=$bin/runs
mkdir -p "$runs"
ip=127.0.0.1
port=$((20000 + RANDOM % 10000))

# case name : program : kind (single, pair, peers, client-first) : server or single arguments : client arguments
#   : seconds allowed. PORT in the arguments becomes the case's port. The ping programs run 23
# sizes of up to 500,000 messages each (one to a few minutes on an idle machine; a ping-pong's
# round trip is the scheduler's on a busy one, hence the margins); ndrpingpong's 1.6 M round
# trips wait on memory, each a hand-off to the engine (docs/architecture.md: 0.15-0.25 ms on
# iWARP on 2 cores, more on RoCE); ndconn runs for 65 s by design, and is client-first: its client
# waits 5 s for the server, then connects for 60 s, and its server stops 65 s after it starts ("the
# extra bit allows the client to finish up first"). Started after the server, the client went on
# connecting after the server stopped; those Connects were refused, and ndconn's client leaks the
# object of a refused Connect, so it never finished (one iWARP run in three). ndmw's second phase (8 M
# awaited 4-byte Writes) takes minutes. ndmrrate runs with its
# default single thread: with more, its barrier (one counter per size, awaited at n and then at
# 2n threads) can miss the first value for good when a thread is descheduled, on any platform.
cases=(
  "ndadapterinfo:ndadapterinfo:single:$ip::60"
  "ndcat:ndcat:single:$ip::60"
  "ndmrlat:ndmrlat:single:$ip::300"
  "ndmrrate:ndmrrate:single:$ip::300"
  "ndcq:ndcq:single:$ip::120"
  "ndping:ndping:pair:-s $ip\:PORT:-c $ip\:PORT:300"
  "ndping-b:ndping:pair:-s -b $ip\:PORT:-c -b $ip\:PORT:300"
  "ndpingpong:ndpingpong:pair:-s $ip\:PORT:-c $ip\:PORT:900"
  "ndpingpong-b:ndpingpong:pair:-s -b $ip\:PORT:-c -b $ip\:PORT:900"
  "ndrping-write:ndrping:pair:-s $ip\:PORT:-c $ip\:PORT:900"
  "ndrping-read:ndrping:pair:-s -r $ip\:PORT:-c -r $ip\:PORT:900"
  "ndrpingpong:ndrpingpong:pair:-s $ip\:PORT:-c $ip\:PORT:1200"
  "ndrpingpong-b:ndrpingpong:pair:-s -b $ip\:PORT:-c -b $ip\:PORT:1200"
  "ndmval:ndmval:pair:-s $ip\:PORT:-c $ip\:PORT:120"
  "ndconn:ndconn:client-first:-s $ip\:PORT:-c $ip\:PORT:150"
  "ndmpic:ndmpic:peers:-s 127.0.0.2 $ip:-c $ip 127.0.0.2:120"
  "ndmw:ndmw:pair:-s $ip\:PORT:-c $ip\:PORT:1800"
)
for test in NdConnClose NdConnListenClosing NdConnReject NdDualConnection NdDualListen NdInvalidIP \
            NdInvalidRead NdInvalidWrite NdLargePrivateData NdLargeQPDepth NdMRDeregister \
            NdMRInvalidBuffer NdOverRead NdOverWrite NdQpMax NdReceiveFlushQP NdSendNoReceive \
            NdReceiveConnClosed NdWriteViolation; do
  cases+=("ndmemorytest-$test:ndmemorytest:pair:-s -t $test $ip\:PORT:-c -t $test $ip\:PORT:120")
done

# Whether something listens (iWARP: TCP) or is bound (RoCE: UDP) on the port.
port_open() {  # transport port
  if [ "$1" = roce ]; then ss -Huan "sport = :$2" | grep -q .; else ss -Hltn "sport = :$2" | grep -q .; fi
}

# Waits (bounded) for a background process; its status, 124 if it outlived the deadline (killed).
finish() {  # pid deadline(epoch seconds)
  while kill -0 "$1" 2>/dev/null; do
    if [ "$(date +%s)" -ge "$2" ]; then
      kill -9 "$1" 2>/dev/null
      wait "$1" 2>/dev/null
      return 124
    fi
    sleep 0.2
  done
  wait "$1"
}

verdict() {  # status -> text
  case $1 in
    0) echo pass ;;
    124) echo "timeout" ;;
    # 128 + n is how the shell reports signal n, but the programs exit with their line numbers
    # (ndconn's 253): a status past 128 + 64 can only be an exit code.
    *) if [ "$1" -gt 128 ] && [ "$1" -le 192 ]; then echo "signal $(( $1 - 128 ))"; else echo "exit $1"; fi ;;
  esac
}

declare -A result
names=()
failed=0
for transport in "${transports[@]}"; do
  export NDWV_TRANSPORTS=$transport
  for entry in "${cases[@]}"; do
    IFS=: read -r name program kind first second seconds <<< "${entry//\\:/@}"
    first=${first//@/:}
    second=${second//@/:}
    [ -n "${MS_SDK_ONLY:-}" ] && ! [[ $name =~ $MS_SDK_ONLY ]] && continue
    [[ " ${names[*]} " == *" $name "* ]] || names+=("$name")
    log=$runs/$transport.$name
    first=${first//PORT/$port}
    second=${second//PORT/$port}
    deadline=$(( $(date +%s) + seconds ))
    status=0
    what=""
    case $kind in
      single)
        # shellcheck disable=SC2086
        "$bin/$program" $first > "$log.single.log" 2>&1 &
        finish $! "$deadline"
        status=$?
        what=$(verdict $status)
        ;;
      pair|peers|client-first)
        if [ "$kind" = client-first ]; then
          # shellcheck disable=SC2086
          "$bin/$program" $second > "$log.client.log" 2>&1 &
          client=$!
          sleep 1
        fi
        # shellcheck disable=SC2086
        "$bin/$program" $first > "$log.server.log" 2>&1 &
        server=$!
        if [ "$kind" = pair ]; then
          for _ in $(seq 100); do port_open "$transport" "$port" && break; kill -0 $server 2>/dev/null || break; sleep 0.1; done
        fi
        if [ "$kind" != client-first ]; then
          # shellcheck disable=SC2086
          "$bin/$program" $second > "$log.client.log" 2>&1 &
          client=$!
        fi
        finish $client "$deadline"
        client_status=$?
        # The server ends on its own after a good client; after a failed one it gets 10 s.
        server_deadline=$deadline
        [ $client_status -ne 0 ] && server_deadline=$(( $(date +%s) + 10 ))
        finish $server "$server_deadline"
        server_status=$?
        status=$(( client_status != 0 ? client_status : server_status ))
        what="client $(verdict $client_status), server $(verdict $server_status)"
        [ $status -eq 0 ] && what=pass
        port=$((port + 1))
        ;;
    esac
    result[$name.$transport]=$what
    printf '%-36s %-6s %s\n' "$name" "$transport" "$what"
    if [ $status -ne 0 ]; then
      failed=1
      for side in "$log".*.log; do echo "    --- last lines of $side"; tail -n 5 "$side" | sed 's/^/    /'; done
    fi
  done
done

echo
printf '| %-34s |' "program"
for transport in "${transports[@]}"; do printf ' %-32s |' "$transport"; done
echo
printf '|%s|' "$(printf -- '-%.0s' $(seq 36))"
for transport in "${transports[@]}"; do printf '%s|' "$(printf -- '-%.0s' $(seq 34))"; done
echo
passes=0 total=0
for name in "${names[@]}"; do
  printf '| %-34s |' "$name"
  for transport in "${transports[@]}"; do
    r=${result[$name.$transport]:-}
    printf ' %-32s |' "$r"
    total=$((total + 1))
    [ "$r" = pass ] && passes=$((passes + 1))
  done
  echo
done
echo
echo "$passes of $total program x transport cases passed (logs: $runs)"
exit $failed
