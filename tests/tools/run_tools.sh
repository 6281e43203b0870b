#!/usr/bin/env bash
# The example tools end to end: each local tool (ndcat, ndadapterinfo, ndmrlat, ndmrrate) once
# per transport, and each server/client pair (ndping, ndconn, ndrpingpong -m and nd1rpingpong -m,
# and the NetworkDirect version 1 tools nd1pingpong, nd1rpingpong, nd1rping -w/-r, also
# nd1pingpong against ndpingpong both ways) as two processes on 127.0.0.1 on a random free port below the ephemeral range, on iWARP and on RoCE
# (NDWV_TRANSPORTS). Exit statuses and the lines each tool must print are checked; sizes and
# iterations are kept small.
#
#   run_tools.sh <directory with the built tools>
#
# Every process runs under `timeout`; whatever is still running when the script exits is killed.
set -euo pipefail

if [ $# -ne 1 ]; then
  echo "usage: $0 <tools dir>" >&2
  exit 2
fi
tools=$(cd "$1" && pwd)

tmp=$(mktemp -d "${TMPDIR:-/tmp}/ndwv-tools.XXXXXX")
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT

export NDWV_BENCH_SIZES=1,4K,64K
export NDWV_BENCH_ITERS=200
export NDWV_TOOL_TIMEOUT_MS=10000
bounded() { timeout -k 5 "$@"; }  # bounded <seconds> command...

fail() {
  echo "FAIL: $*" >&2
  exit 1
}
show_fail() {  # show_fail <output file>... -- <message>
  local files=()
  while [ "$1" != -- ]; do files+=("$1"); shift; done
  shift
  for f in "${files[@]}"; do echo "---- $f"; cat "$f"; done
  fail "$*"
}
expect() {  # expect <file> <extended regex>...: every pattern must match a line
  local file=$1
  shift
  for pattern in "$@"; do
    grep -Eq -- "$pattern" "$file" || show_fail "$file" -- "no line matching '$pattern' in $(basename "$file")"
  done
}

# A port nothing listens on (TCP or UDP), from 20000 up to the start of the kernel's ephemeral
# range (32768 by default): a port in that range can be taken by any connection of a test running
# alongside (ctest -j) between this check and the server's bind.
free_port() {
  local low=32768 high port
  read -r low _ < /proc/sys/net/ipv4/ip_local_port_range || true
  high=$((low > 21000 ? low - 1 : 40000))
  for _ in $(seq 1 100); do
    port=$((20000 + RANDOM % (high - 20000 + 1)))
    if ! ss -Htanu 2>/dev/null | awk '{print $5}' | grep -Eq "[:.]$port\$"; then
      echo "$port"
      return
    fi
  done
  fail "no free port in 20000-$high"
}

# A table row of the ping tools: size and iterations with the trailing 'l', then three numbers.
row() { echo "^ +$1l +$2l +[0-9.]+ +[0-9.]+ +[0-9]+\$"; }

run_local() {  # run_local <transport>
  local t=$1 out
  out="$tmp/ndcat-$t"
  bounded 30 "$tools/ndcat" 127.0.0.1 > "$out" 2>&1 || show_fail "$out" -- "ndcat ($t)"
  expect "$out" '^Retrieving the full Addresslist$' '^Validation of full Addresslist passed$'

  out="$tmp/ndadapterinfo-$t"
  bounded 30 "$tools/ndadapterinfo" 127.0.0.1 > "$out" 2>&1 || show_fail "$out" -- "ndadapterinfo ($t)"
  expect "$out" '^InfoVersion: 131072$' '^AdapterId: 0x[0-9a-f]{8,}$' '^MaxCompletionQueueDepth: [0-9]+$' \
    '^AdapterFlags:$' $'^\t\tND_ADAPTER_FLAG_IN_ORDER_DMA_SUPPORTED$'
  # With no argument: the usage and -1.
  local rc=0
  bounded 30 "$tools/ndadapterinfo" > "$out.noargs" 2>&1 || rc=$?
  [ "$rc" -eq 255 ] || show_fail "$out.noargs" -- "ndadapterinfo without arguments exited $rc, not -1"

  out="$tmp/ndmrlat-$t"
  bounded 60 "$tools/ndmrlat" 127.0.0.1 > "$out" 2>&1 || show_fail "$out" -- "ndmrlat ($t)"
  expect "$out" '^Beginning test: ndmrlat.exe$' '^Using [0-9]+ processors. Sender Frequency is [0-9]+$' \
    '^ Event Driven:$' '^ IOCP:$' 'Register \(usec\) +Deregister \(usec\) +CPU$' \
    '^ +Size +call +total +call +total$' '^ +65536( +[0-9]+\.[0-9]{2}){5}$' '^End of test: ndmrlat.exe$'
  [ "$(grep -Ec '^ +(1|4096|65536)( +[0-9]+\.[0-9]{2}){5}$' "$out")" -eq 6 ] ||
    show_fail "$out" -- "ndmrlat ($t): expected 3 rows per pass"

  out="$tmp/ndmrrate-$t"
  bounded 60 "$tools/ndmrrate" -t 2 127.0.0.1 > "$out" 2>&1 || show_fail "$out" -- "ndmrrate ($t)"
  expect "$out" '^Beginning test: ndmrrate.exe$' '^Running test with 2 threads$' \
    'Register +Deregister$' '^ +Size +Iter +usec +CPU +usec +CPU$' \
    '^ +65536l +200l( +[0-9]+\.[0-9]{2}){4}$' '^End of test: ndmrrate.exe$'
  echo "local tools on $t: ok"
}

# Starts `<server tool> -s` on a free port, runs `<client tool> -c` against it; both must
# succeed. Their output goes to $tmp/<client tool>-<transport>.{server,client}.
run_tools() {  # run_tools <server tool> <client tool> <transport> <server options> -- <client options...>
  local server_tool=$1 tool=$2 t=$3
  shift 3
  local server_options=()
  while [ "$1" != -- ]; do server_options+=("$1"); shift; done
  shift
  local port
  port=$(free_port)
  local out="$tmp/$tool-$t"
  NDWV_TRANSPORTS=$t bounded 60 "$tools/$server_tool" -s "${server_options[@]}" "127.0.0.1:$port" \
    > "$out.server" 2>&1 &
  local server=$!
  pids+=("$server")
  # The client retries a refused connection while the server comes up.
  if ! NDWV_TRANSPORTS=$t bounded 60 "$tools/$tool" -c "$@" "127.0.0.1:$port" > "$out.client" 2>&1; then
    show_fail "$out.client" "$out.server" -- "$tool client ($t)"
  fi
  wait "$server" || show_fail "$out.server" "$out.client" -- "$server_tool server ($t)"
}
run_pair() {  # run_pair <tool> <transport> <client options...>
  local tool=$1 t=$2
  shift 2
  run_tools "$tool" "$tool" "$t" -- "$@"
}
# A measuring tool's client printed its three rows and both sides their banners.
expect_rows() {  # expect_rows <tool> <transport> <iterations>
  local out="$tmp/$1-$2"
  expect "$out.client" "^Beginning test: $1.exe\$" '^ +Size +Iter +Latency +CPU +Bytes/Sec$' \
    "$(row 1 "$3")" "$(row 4096 "$3")" "$(row 65536 "$3")" "^End of test: $1.exe\$"
  expect "$out.server" '^Beginning test: nd1?[a-z]+\.exe$' '^End of test: nd1?[a-z]+\.exe$'
}

# One run of `<tool> -m` as server and client: true if neither side's engine took the socket
# back late more than NDWV_TOOLS_LATE_TAKEOVERS times; leaves the two counts in $seen.
memory_waits_in_bound() {  # memory_waits_in_bound <tool> <transport>
  local m=$1 t=$2 side takeovers within=true
  run_tools "$m" "$m" "$t" -m -- -m
  expect_rows "$m" "$t" 200
  seen=""
  for side in client server; do
    takeovers=$(grep -Eo 'late_engine_takeovers=[0-9]+' "$tmp/$m-$t.$side" | head -1 | cut -d= -f2)
    [ -n "$takeovers" ] || show_fail "$tmp/$m-$t.$side" -- "$m -m ($t, $side): no late_engine_takeovers counter"
    [ "$takeovers" -le "${NDWV_TOOLS_LATE_TAKEOVERS:-30}" ] || within=false
    seen="$seen $side $takeovers"
  done
  $within
}

for t in iwarp roce; do
  NDWV_TRANSPORTS=$t run_local "$t"

  run_pair ndping "$t"
  out="$tmp/ndping-$t"
  expect "$out.client" '^Beginning test: ndping.exe$' '^Using [0-9]+ processors. Sender Frequency is [0-9]+$' \
    '^ +Size +Iter +Latency +CPU +Bytes/Sec$' "$(row 1 200)" "$(row 4096 200)" "$(row 65536 200)" \
    '^End of test: ndping.exe$'
  expect "$out.server" '^Beginning test: ndping.exe$' '^End of test: ndping.exe$'
  echo "ndping on $t: ok ($(grep -E "$(row 65536 200)" "$out.client" | tr -s ' '))"

  run_pair ndping "$t" -b -n 2 -q 4
  expect "$tmp/ndping-$t.client" "$(row 65536 200)" '^End of test: ndping.exe$'
  echo "ndping -b -n 2 -q 4 on $t: ok"

  run_pair ndconn "$t" -n 100
  out="$tmp/ndconn-$t"
  expect "$out.client" '^ +Cycles +Seconds +Cycles/s +usec/cycle$' '^ +100 +[0-9]+\.[0-9]{2} +[0-9]+\.[0-9]{2} +[0-9]+\.[0-9]{2}$'
  expect "$out.server" '^Accepted 101 connections\.$'
  # The steps of a cycle, each timed, in order.
  expect "$out.client" '^Step +usec/cycle +least +greatest$' '^CreateQueuePair( +[0-9]+\.[0-9]{2}){3}$' \
    '^Bind( +[0-9]+\.[0-9]{2}){3}$' '^Connect( +[0-9]+\.[0-9]{2}){3}$' '^Disconnect( +[0-9]+\.[0-9]{2}){3}$' \
    '^Release( +[0-9]+\.[0-9]{2}){3}$'
  if grep -q 'Beginning test' "$out.client" "$out.server"; then fail "ndconn printed a banner"; fi
  echo "ndconn on $t: ok ($(grep -E '^ +100 ' "$out.client" | tr -s ' '))"

  # -m: both sides wait for the peer's RDMA Write on memory alone, polling only to reap their own
  # Write. The engine must not leave the socket to pollers that then stop (PollerRule,
  # dev/poller_handoff.h): each takeover by its timer that finds data waiting is a wait of up to
  # 10 ms. A few may happen (a preempted process; NDWV_TOOLS_LATE_TAKEOVERS, default 30, allows
  # more under ThreadSanitizer); one per round trip is the stall this guards against. That stall
  # comes back in every run, while a machine busy with other tests can preempt the processes of
  # one run hundreds of times: a pair passes if one of three runs stays within the bound.
  for m in ndrpingpong nd1rpingpong; do
    for attempt in 1 2 3; do
      if memory_waits_in_bound "$m" "$t"; then break; fi
      [ "$attempt" -lt 3 ] || show_fail "$tmp/$m-$t.client" "$tmp/$m-$t.server" -- "$m -m ($t): more than ${NDWV_TOOLS_LATE_TAKEOVERS:-30} late engine takeovers in 600 round trips in each of 3 runs:$seen"
      echo "$m -m on $t: run $attempt had late engine takeovers$seen; again"
    done
    echo "$m -m on $t: ok ($(grep -E "$(row 65536 200)" "$tmp/$m-$t.client" | tr -s ' '); late engine takeovers:$seen)"
  done

  # NetworkDirect version 1, and version 1 meeting version 2 (one wire, one message protocol).
  run_pair nd1pingpong "$t"
  expect_rows nd1pingpong "$t" 200
  run_pair nd1pingpong "$t" -b -n 2
  expect_rows nd1pingpong "$t" 200
  run_tools ndpingpong nd1pingpong "$t" --
  expect_rows nd1pingpong "$t" 200
  run_tools nd1pingpong ndpingpong "$t" --
  expect_rows ndpingpong "$t" 200
  run_pair nd1rpingpong "$t"
  expect_rows nd1rpingpong "$t" 200
  run_tools nd1rping nd1rping "$t" -w -- -w
  expect_rows nd1rping "$t" 200
  run_tools nd1rping nd1rping "$t" -r -- -r -n 2
  expect_rows nd1rping "$t" 200
  echo "version 1 tools on $t: ok ($(grep -E "$(row 65536 200)" "$tmp/nd1rping-$t.client" | tr -s ' '))"
done
echo "all tools: ok"
