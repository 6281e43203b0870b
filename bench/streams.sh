#!/usr/bin/env bash
# bench/streams.sh -- many streams at once: N connections between two processes on 127.0.0.1, each
# streaming one-way bulk data at the same time; the aggregate rate of ndwv (iWARP, RoCE) against
# plain TCP, side by side.
#
#   bench/streams.sh [-n N] [-s SIZE] [-k K] [-t SECONDS] [--build DIR] [--small-buffers]
#
# Runs tcp_streams (the reference), then nd_streams with NDWV_TRANSPORTS=iwarp and =roce, with the
# same N, SIZE and SECONDS (K, the RDMA Writes in flight per connection, is nd_streams' alone),
# each a client that starts its own server, each under timeout(1). Prints one table: GB/s (1e9
# bytes a second) and the ratio to TCP, and for RoCE the counters of both its processes summed
# (NDWV_COUNTERS=exit): what its congestion control did when the connections share its UDP sockets.
# --small-buffers gives the ndwv runs NDWV_ROCE_SOCKET_BUFFER=212992, what a process without root
# gets. Builds nothing: `cmake --build build-bench --target tcp_streams nd_streams`.
#
# Exit status: 0 when every run ended well; 1 when one failed (an error, a bound passed, a
# timeout); 2 for a usage error or a missing build. Timing is never a failure.
set -u
set -o pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$here")

usage() {
  sed -n '2,6p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
  cat <<'EOF'
  -n N             connections (default 128)
  -s SIZE          bytes of each message / RDMA Write (default 65536)
  -k K             RDMA Writes in flight on every ndwv connection (default 4)
  -t SECONDS       how long each run streams (default 5)
  --build DIR      build directory, absolute or relative to the repository (default build-bench)
  --small-buffers  NDWV_ROCE_SOCKET_BUFFER=212992 for the ndwv runs (a process without root)
EOF
}

n=128 size=65536 k=4 seconds=5 build=build-bench small=0
while [ $# -gt 0 ]; do
  case "$1" in
    -n|-s|-k|-t|--build)
      [ $# -ge 2 ] || { usage >&2; exit 2; }
      case "$1" in -n) n=$2 ;; -s) size=$2 ;; -k) k=$2 ;; -t) seconds=$2 ;; --build) build=$2 ;; esac
      shift ;;
    --small-buffers) small=1 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "streams.sh: unknown argument $1" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
for v in "$n" "$size" "$k" "$seconds"; do
  case "$v" in ''|*[!0-9]*|0) echo "streams.sh: -n, -s, -k and -t take positive numbers (got '$v')" >&2; exit 2 ;; esac
done
case "$build" in /*) ;; *) [ -d "$build" ] || build=$repo/$build ;; esac
for p in tcp_streams nd_streams; do
  [ -x "$build/bench/$p" ] || { echo "streams.sh: $build/bench/$p is not built" >&2; exit 2; }
done

work=$(mktemp -d /tmp/ndwv-streams.XXXXXX) || exit 2
trap 'rm -rf "$work"' EXIT
# The programs bound each of their waits (60 s); timeout(1) is the backstop behind them.
limit=$((seconds + 300))
ndenv=()
[ "$small" = 1 ] && ndenv+=(NDWV_ROCE_SOCKET_BUFFER=212992)
counters="retransmits rx_out_of_sequence ack_timeouts cnps_sent cnps_received port_datagrams_overflowed"

failed=0
declare -A rate status
# run NAME ENV... -- PROGRAM ARGS...: the output is kept in $work/NAME.out, the rate in rate[NAME].
run() {
  local name=$1 rc
  shift
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  echo "streams.sh: $name: $*" >&2
  env ${envs[@]+"${envs[@]}"} timeout -k 10 "$limit" "$@" >"$work/$name.out" 2>&1
  rc=$?
  rate[$name]=$(awk -F': ' '/^aggregate GB\/s:/ { print $2 }' "$work/$name.out")
  status[$name]=ok
  if [ $rc -ne 0 ] || ! grep -q '^result: ok' "$work/$name.out"; then
    status[$name]="FAILED (exit $rc)"
    [ $rc -eq 124 ] && status[$name]="TIMED OUT after $limit s"
    failed=1
    echo "streams.sh: $name failed (exit $rc); its output:" >&2
    sed 's/^/  /' "$work/$name.out" >&2
  fi
}

run TCP -- "$build/bench/tcp_streams" -n "$n" -s "$size" -t "$seconds"
run iWARP ${ndenv[@]+"${ndenv[@]}"} NDWV_TRANSPORTS=iwarp -- "$build/bench/nd_streams" -n "$n" -s "$size" -k "$k" -t "$seconds"
run RoCE ${ndenv[@]+"${ndenv[@]}"} NDWV_TRANSPORTS=roce NDWV_COUNTERS=exit NDWV_COUNTERS_FILE="$work/counters.%p" \
  -- "$build/bench/nd_streams" -n "$n" -s "$size" -k "$k" -t "$seconds"

# The adapters' totals of both RoCE processes (a report's per-connection rows are in them already).
roce_counters=$(cat "$work"/counters.* 2>/dev/null | awk -v names="$counters" '
  BEGIN { count = split(names, wanted, " "); for (i in wanted) { keep[wanted[i]] = 1; sum[wanted[i]] = 0 } }
  /^ndwv counters:/ { adapter = ($NF == "adapter"); next }
  adapter { for (i = 1; i <= NF; i++) { split($i, kv, "="); if (kv[1] in keep) sum[kv[1]] += kv[2] } }
  END { for (i = 1; i <= count; i++) printf "%s%d", (i > 1 ? " " : ""), sum[wanted[i]] }')
reports=$(find "$work" -name "counters.*" | wc -l)

echo
buffers=
[ "$small" = 1 ] && buffers="; ndwv's UDP socket buffers 212992 (no root)"
echo "Many streams: $n connections on 127.0.0.1, $size-byte messages / RDMA Writes ($k in flight each), $seconds s$buffers"
printf '%-9s %8s %7s | %11s %13s %12s %9s %13s %10s\n' transport GB/s ratio retransmits rx_out_of_seq ack_timeouts \
  cnps_sent cnps_received overflowed
for name in TCP iWARP RoCE; do
  r=${rate[$name]:-} ratio=-
  if [ "${status[$name]}" != ok ] || [ -z "$r" ]; then r=${status[$name]}; fi
  if [ "${status[$name]}" = ok ] && [ "${status[TCP]}" = ok ] && [ -n "${rate[TCP]:-}" ]; then
    ratio=$(awk -v a="${rate[$name]}" -v b="${rate[TCP]}" 'BEGIN { printf (b > 0 ? "%.2f" : "-"), a / b }')
  fi
  if [ "$name" = RoCE ] && [ "$reports" -gt 0 ]; then
    # shellcheck disable=SC2086
    printf '%-9s %8s %7s | %11s %13s %12s %9s %13s %10s\n' "$name" "$r" "$ratio" $roce_counters
  else
    printf '%-9s %8s %7s | %11s %13s %12s %9s %13s %10s\n' "$name" "$r" "$ratio" - - - - - -
  fi
done
[ "$reports" -eq 2 ] || echo "(RoCE counters: $reports of 2 processes reported)"
echo "(counters: both RoCE processes summed; overflowed = port_datagrams_overflowed)"
exit "$failed"
