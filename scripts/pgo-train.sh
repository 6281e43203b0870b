#!/usr/bin/env bash
# The training run of a profile-guided build: scripts/pgo-train.sh <build dir>, on a library built
# with -DNDWV_PGO=GENERATE (scripts/build.sh --pgo does all three steps). Runs the ND tools as
# server and client on 127.0.0.1, on both transports: send/receive (v2, and v1's ping-pong), RDMA
# Write and Read, small and large, latency and streams. The profile is what an HPC program does most: small messages
# one at a time and large transfers back to back. About 20 s on 2 cores.
set -euo pipefail
dir=$1
export NDWV_BENCH_ITERS=20000  # per size; large sizes take fewer (the tools' own rule)
port=$((20000 + RANDOM % 12000))  # below the ephemeral range (32768-60999): no outgoing connection holds it
export TOOL_PAIR_TIMEOUT=60

log=$(mktemp)
trap 'rm -f "$log"' EXIT
run_pair() {  # sizes tool options...
  # A pair that fails says which it was and what the client printed (exit status 124: timed out).
  local status=0
  NDWV_BENCH_SIZES=$1 "$(dirname "$0")/tool-pair.sh" "$dir" "$port" "${@:2}" >"$log" 2>&1 || status=$?
  if [ "$status" != 0 ]; then
    echo "pgo-train: $NDWV_TRANSPORTS ${*:2} (sizes $1, port $port) failed, exit status $status" >&2
    cat "$log" >&2
    return "$status"
  fi
  port=$((port + 1))
}

for NDWV_TRANSPORTS in iwarp roce; do
  export NDWV_TRANSPORTS
  run_pair 8,64,4096,65536 ndpingpong -p
  run_pair 8,4096 nd1pingpong -p  # NetworkDirect v1's own objects (src/nd/v1)
  run_pair 8,4096 ndrpingpong -p
  run_pair 4096,65536,1048576 ndrping -p -w
  run_pair 4096,65536 ndrping -p -r
  run_pair 65536,1048576 ndping -p
done
