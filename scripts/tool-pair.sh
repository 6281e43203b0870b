#!/usr/bin/env bash
# Runs one ND tool as a server and a client on 127.0.0.1 (the demo and the profile training):
#   scripts/tool-pair.sh <build dir> <port> <tool> [options...]
# The client's output goes to stdout, the server's is dropped. The client starts once the server
# listens (ss(8); at most 5 s). Each process runs under timeout(1), TOOL_PAIR_TIMEOUT seconds
# (default 120); the exit status is the client's, else the server's.
set -euo pipefail
dir=$1 port=$2 tool=$3; shift 3
limit=${TOOL_PAIR_TIMEOUT:-120}
listening() { [ -n "$(ss -Hltnu "sport = :$port" 2>/dev/null)" ]; }

timeout "$limit" "$dir/tools/$tool" -s "$@" "127.0.0.1:$port" >/dev/null &
server=$!
trap 'kill "$server" 2>/dev/null || true' EXIT  # a server whose client failed
for _ in $(seq 50); do listening && break; sleep 0.1; done
timeout "$limit" "$dir/tools/$tool" -c "$@" "127.0.0.1:$port"
wait "$server"
