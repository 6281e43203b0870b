#!/usr/bin/env bash
# The demo: installs what is missing, builds, then runs a server and a client process on
# 127.0.0.1 doing send/receive (ndpingpong), RDMA Write (ndrpingpong, ndrping -w) and RDMA Read
# (ndrping -r), each printing latency and bandwidth, then the same through NetworkDirect
# version 1 (nd1pingpong, nd1rpingpong, nd1rping): on iWARP, then on RoCEv2.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh --pgo build -DNDWV_TESTS=OFF -DNDWV_SANITIZE=OFF
export NDWV_BENCH_SIZES=${NDWV_BENCH_SIZES:-8,4096,65536,1048576}
export NDWV_BENCH_ITERS=${NDWV_BENCH_ITERS:-2000}
port=$((20000 + RANDOM % 12000))  # below the ephemeral range (32768-60999): no outgoing connection holds it
run_pair() {  # tool, options...  (NDWV_TRANSPORTS from the environment)
  echo "=== ${NDWV_TRANSPORTS%%+*}: $* (server and client on 127.0.0.1:$port)"
  scripts/tool-pair.sh build "$port" "$@"
  port=$((port + 1))
}
for NDWV_TRANSPORTS in iwarp roce; do
  export NDWV_TRANSPORTS
  run_pair ndpingpong -p
  run_pair ndrpingpong -p
  run_pair ndrping -p -w
  run_pair ndrping -p -r
  run_pair nd1pingpong -p
  run_pair nd1rpingpong -p
  run_pair nd1rping -p -w
  run_pair nd1rping -p -r
done
