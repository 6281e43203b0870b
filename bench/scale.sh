#!/usr/bin/env bash
# bench/scale.sh -- many connections: ndwv (iWARP, RoCE) against plain TCP, side by side, in one run.
#
#   bench/scale.sh [options] N [K[,K...]]     N connections, K connects in flight (default 64)
#
# For each K: tcp_scale (the reference), tcp_scale --mpa (TCP with MPA's three setup messages on
# every connection: the floor under an iWARP setup, idle 0), then nd_scale on iWARP, then on RoCE,
# each a client that starts its own server, each pair in a network namespace of its own when
# `unshare -rn` works (so that the kernel's packet counters count that pair only), each process
# under timeout(1). Then a table per phase (setup, idle, echo-all, teardown), every figure next
# to its TCP reference with the ratio to it. Builds nothing: `cmake --build BUILD --target tcp_scale nd_scale`.
#
# --crash ends each run by killing its server (SIGKILL) instead of the teardown: the "peer
# crash" table then says how long every connection took to report its end (TCP's kernel resets
# them; RoCE's keepalives and retries find the dead peer).
#
# --rounds R runs that sequence R times over, so that each round's runs share the machine's
# moment. A measure (rates, times, CPU, memory, packets) is then the median of the rounds, and its
# ratio the median of the rounds' own ratios to their TCP run; an outcome (connected, lost,
# failed, mismatches, descriptors, threads) is the worst round's.
#
# Exit status: 0 when every run ended well; 1 when a run reported a failure (connections lost or
# refused, a phase past its bound, a ledger mismatch), got stuck or timed out -- the library's
# failures at scale are what this measures, and the table shows them; 2 for a usage error, a
# missing build, or a descriptor limit too low for N. Timing is never a failure.
#
# Environment: NDWV_* settings pass through to nd_scale (NDWV_TRANSPORTS is set per run).
# Raw outputs are kept in BUILD/bench-results/scale-<time>/.
set -u
set -o pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$here")

usage() {
  sed -n '2,4p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
  cat <<'EOF'
  --build DIR     build directory (default: <repo>/build-bench if it has the programs, else <repo>/build)
  --idle S        seconds the connections stay idle (default 10)
  --cqs C         completion queues the ndwv QPs share (default 1)
  --bound S       bound of each of the setup, echo and teardown phases (default 60)
  --transports L  ndwv transports to run, comma-separated (default iwarp,roce)
  --rounds R      run every K's sequence R times; the table gives medians and worst cases (default 1)
  --no-netns      run in the machine's network namespace (packet counts then include all traffic)
  --crash         kill each server instead of the teardown, and time how long until every
                  connection has reported its end
See the comment at the top of this script for what it runs and its exit status.
EOF
}

build="" idle=10 cqs=1 bound=60 transports="iwarp,roce" netns=1 rounds=1 crash=() args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --build) [ $# -ge 2 ] || { usage >&2; exit 2; }; build=$2; shift ;;
    --idle) [ $# -ge 2 ] || { usage >&2; exit 2; }; idle=$2; shift ;;
    --cqs) [ $# -ge 2 ] || { usage >&2; exit 2; }; cqs=$2; shift ;;
    --bound) [ $# -ge 2 ] || { usage >&2; exit 2; }; bound=$2; shift ;;
    --transports) [ $# -ge 2 ] || { usage >&2; exit 2; }; transports=$2; shift ;;
    --rounds) [ $# -ge 2 ] || { usage >&2; exit 2; }; rounds=$2; shift ;;
    --no-netns) netns=0 ;;
    --crash) crash=(--crash) ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "scale.sh: unknown option $1" >&2; usage >&2; exit 2 ;;
    *) args+=("$1") ;;
  esac
  shift
done
if [ ${#args[@]} -lt 1 ] || [ ${#args[@]} -gt 2 ]; then usage >&2; exit 2; fi
n=${args[0]}
ks=${args[1]:-64}
number() { case "$2" in ''|*[!0-9]*) echo "scale.sh: $1 must be a positive number (got '$2')" >&2; exit 2 ;; esac; }
number N "$n"; number --idle "$idle"; number --cqs "$cqs"; number --bound "$bound"; number --rounds "$rounds"
for k in $(echo "$ks" | tr ',' ' '); do number K "$k"; done
[ "$n" -ge 1 ] || { echo "scale.sh: N must be at least 1" >&2; exit 2; }
[ "$rounds" -ge 1 ] || { echo "scale.sh: --rounds must be at least 1" >&2; exit 2; }

if [ -z "$build" ]; then
  build=$repo/build-bench
  [ -x "$build/bench/nd_scale" ] || build=$repo/build
fi
tcp=$build/bench/tcp_scale
nd=$build/bench/nd_scale
for p in "$tcp" "$nd"; do
  if [ ! -x "$p" ]; then
    echo "scale.sh: $p not built; run: cmake --build $build --target tcp_scale nd_scale" >&2
    exit 2
  fi
done
for t in timeout awk; do command -v "$t" >/dev/null || { echo "scale.sh: needs $t" >&2; exit 2; }; done

# Descriptors: each process holds about one per connection (TCP and iWARP: a socket; RoCE: a
# socket per bound connector port and per accepted connection), plus a few of its own.
need=$((n + 64))
soft=$(ulimit -Sn) hard=$(ulimit -Hn)
if [ "$hard" = unlimited ] || [ "$hard" -ge "$need" ]; then
  [ "$soft" != unlimited ] && [ "$soft" -lt "$need" ] && ulimit -Sn "$hard" 2>/dev/null
  echo "descriptors: limit $(ulimit -Sn) per process (was $soft, hard limit $hard); N = $n needs about $need"
else
  echo "descriptors: N = $n needs about $need per process, but the hard limit is $hard:"
  echo "  N is too large for this machine's limit; lower N or raise the hard limit (as root: ulimit -Hn)"
  exit 2
fi

wrap=()
if [ $netns -eq 1 ]; then
  if command -v unshare >/dev/null && command -v ip >/dev/null &&
     unshare -rn sh -c 'ip link set lo up' 2>/dev/null; then
    wrap=(unshare -rn sh -c 'ip link set lo up && exec "$@"' sh)
    echo "network: each pair in a network namespace of its own (kernel packet counts are the pair's)"
  else
    echo "network: no private namespace (unshare -rn failed): kernel packet counts include all traffic"
  fi
else
  echo "network: the machine's namespace (--no-netns): kernel packet counts include all traffic"
fi

# A client's worst case: each bounded phase, the idle period, the setup grace periods, the
# replies; its watchdog ends it sooner if a step hangs.
limit=$((5 * bound + idle + 120))
logdir="$build/bench-results/scale-$(date +%Y%m%d-%H%M%S)"
mkdir -p "$logdir" || exit 2
echo "raw output: $logdir"

# figure FILE PHASE CODE -> what the awk CODE prints, reading the keys of the file's
# "@ phase=PHASE" line (or "@ result=..." for PHASE result) with f("key") (a number) and
# s("key") (the text); nothing when the run printed no such line.
figure() {
  [ -f "$1" ] || return 0
  awk -v ph="$2" '
    function f(key) { return val[key] + 0 }
    function s(key) { return val[key] }
    $1 == "@" && ($2 == "phase=" ph || (ph == "result" && $2 ~ /^result=/)) {
      for (i = 2; i <= NF; i++) { p = index($i, "="); val[substr($i, 1, p - 1)] = substr($i, p + 1) }
      found = 1 }
    END { if (found) { '"$3"' } }' "$1"
}
# row LABEL PHASE CODE [HOW]: one column per run, a number next to its ratio to TCP's. With
# several rounds, HOW combines them: median (a measure: the median value, and the median of the
# rounds' own ratios), min or max (an outcome: the round whose figure, or sum of a/b, is least or
# most, as it printed, and its ratio to its round's TCP).
row() {
  local label=$1 phase=$2 code=$3 how=${4:-median} i j line values
  line=$(printf '  %-34s' "$label")
  for i in "${!names[@]}"; do
    values=()
    for j in $(seq "$rounds"); do
      values+=("$(figure "$logdir/k$k-r$j-${names[$i]}.txt" "$phase" "$code")"
               "$(figure "$logdir/k$k-r$j-${names[0]}.txt" "$phase" "$code")")
    done
    line+=$(printf '%s\n' "${values[@]}" | awk -v how="$how" -v first="$((i == 0))" '
      function number(x,   parts, i, sum) {  # "done/of" ranks by done (of is N); "client/server" by both
        if (x !~ /^[0-9.]+(\/[0-9.]+)*$/) return ""
        split(x, parts, "/"); for (i in parts) sum += parts[i]; return sum }
      function median(a, n,   i, j, t) {
        for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j - 1] > a[j]; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
        return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
      NR % 2 == 1 { v[++n] = $0; next }
      { ref[n] = $0 }
      END {
        shown = "n/a"; r = "-"
        if (how == "median") {
          for (i = 1; i <= n; i++) {
            if (v[i] ~ /^[0-9.]+$/) vals[++nv] = v[i] + 0
            if (v[i] ~ /^[0-9.]+$/ && ref[i] ~ /^[0-9.]+$/ && ref[i] + 0 > 0) ratios[++nr] = v[i] / ref[i] }
          if (nv == n && n > 0) {  # a measure every round gave, with as many decimals as printed
            d = index(v[1], ".") ? length(v[1]) - index(v[1], ".") : 0
            shown = sprintf("%." d "f", median(vals, nv)) }
          else if (n > 0 && v[1] != "") shown = v[1]  # text: as the first round printed it
          if (nr == n && n > 0) r = sprintf("%.2f", median(ratios, nr))
        } else {
          pick = 0
          for (i = 1; i <= n; i++) {
            x = number(v[i]); if (x == "") continue
            if (!pick || (how == "min" ? x < best : x > best)) { pick = i; best = x } }
          if (pick) {
            shown = v[pick]
            if (v[pick] ~ /^[0-9.]+$/ && ref[pick] ~ /^[0-9.]+$/ && ref[pick] + 0 > 0) r = sprintf("%.2f", v[pick] / ref[pick]) }
          else if (n > 0 && v[1] != "") shown = v[1]
        }
        if (first) printf "%14s", shown; else printf "%14s %6s", shown, r }')
  done
  echo "$line"
}

# The runs: the reference first, the setup floor of an MPA handshake, then each ndwv transport.
names=(tcp tcpmpa) labels=(TCP TCP+MPA)
IFS=, read -r -a tlist <<<"$transports"
for t in "${tlist[@]}"; do
  case "$t" in
    iwarp) names+=(iwarp) labels+=(iWARP) ;;
    roce) names+=(roce) labels+=(RoCE) ;;
    *) echo "scale.sh: unknown transport '$t' (iwarp, roce)" >&2; exit 2 ;;
  esac
done

status=0
for k in $(echo "$ks" | tr ',' ' '); do
  opts=(-n "$n" -k "$k" --idle "$idle" --bound "$bound" "${crash[@]}")
  echo
  echo "N = $n connections, K = $k outstanding, $cqs CQ(s) for ndwv, idle $idle s, bound $bound s per phase$([ "$rounds" -gt 1 ] && echo ", $rounds rounds"):"
  for j in $(seq "$rounds"); do
    [ "$rounds" -gt 1 ] && echo "  round $j"
    for i in "${!names[@]}"; do
      name=${names[$i]}
      out="$logdir/k$k-r$j-$name.txt"
      case $name in
        tcp) cmd=("$tcp" "${opts[@]}") ;;
        tcpmpa) cmd=("$tcp" "${opts[@]}" --idle 0 --mpa) ;;  # its idle, echo and teardown are TCP's
        *) cmd=(env "NDWV_TRANSPORTS=$name" "$nd" "${opts[@]}" --cqs "$cqs") ;;
      esac
      echo "# ${cmd[*]}" >"$out.cmd"
      printf "  %-8s " "${labels[$i]}"
      t0=$SECONDS
      timeout -k 5 "$limit" "${wrap[@]}" "${cmd[@]}" >"$out" 2>&1
      rc=$?
      case $rc in
        0) verdict=ok ;;
        1) verdict="FAILED (see below)" ;;
        3) verdict="STUCK: a step overran its bound ($(grep -m1 -o "step '[^']*'" "$out"))" ;;
        124|137) verdict="TIMED OUT after $limit s" ;;
        *) verdict="exit $rc: $(grep -m1 '^error' "$out")" ;;
      esac
      [ $rc -eq 0 ] || status=1
      [ $rc -eq 2 ] && status=2
      echo "$((SECONDS - t0)) s, $verdict"
    done
  done

  echo
  header=$(printf '  %-34s%14s' "(ratio = to TCP)" "${labels[0]}")
  for i in "${!labels[@]}"; do [ "$i" -gt 0 ] && header+=$(printf '%14s %6s' "${labels[$i]}" ratio); done
  echo "$header"
  echo "setup, K = $k"
  row "connected"                  setup 'printf "%d/%d", f("done"), f("of")' min
  row "seconds"                    setup 'printf "%.3f", f("seconds")'
  row "conn/s"                     setup 'printf "%.0f", f("rate")'
  row "lost during setup"          setup 'printf "%d", f("lost")' max
  row "input backlog drops (kernel)" setup 'printf "%d", f("kernel.backlog_drops")' max
  row "slowest tenth of N, conn/s" setup 'n = split(s("tenths"), t, ","); m = ""; for (j = 1; j <= n; j++) if (m == "" || t[j] + 0 < m) m = t[j] + 0; if (m != "") printf "%.0f", m'
  row "CPU s, client"              setup 'printf "%.3f", f("c.cpu_ms") / 1000'
  row "  its application threads"  setup 'printf "%.3f", f("c.cpu_app_ms") / 1000'
  row "  its engine thread"        setup 'printf "%.3f", f("c.cpu_engine_ms") / 1000'
  row "CPU s, server"              setup 'printf "%.3f", f("s.cpu_ms") / 1000'
  row "  its application threads"  setup 'printf "%.3f", f("s.cpu_app_ms") / 1000'
  row "  its engine thread"        setup 'printf "%.3f", f("s.cpu_engine_ms") / 1000'
  row "RSS MiB, client"            setup 'printf "%.1f", f("c.rss_kb") / 1024'
  row "RSS MiB, server"            setup 'printf "%.1f", f("s.rss_kb") / 1024'
  row "descriptors, client"        setup 'printf "%d", f("c.fds")' max
  row "descriptors, server"        setup 'printf "%d", f("s.fds")' max
  row "threads, client/server"     setup 'printf "%d/%d", f("c.threads"), f("s.threads")' max
  echo "idle ($idle s)"
  row "still up (of those up before)" idle 'printf "%d/%d", f("done"), f("of")' min
  row "CPU ms, client"             idle 'printf "%.1f", f("c.cpu_ms")'
  row "CPU ms, server"             idle 'printf "%.1f", f("s.cpu_ms")'
  row "kernel packets sent"        idle 'printf "%d", f("kernel.tcp_out_segs") + f("kernel.udp_out_datagrams")'
  row "input backlog drops (kernel)" idle 'printf "%d", f("kernel.backlog_drops")' max
  row "keepalives sent (ndwv)"     idle 'printf "%d", f("c.keepalives_sent") + f("s.keepalives_sent")'
  row "ack timeouts (ndwv)"        idle 'printf "%d", f("c.ack_timeouts") + f("s.ack_timeouts")' max
  row "retry exceeded (ndwv)"      idle 'printf "%d", f("c.retry_exceeded") + f("s.retry_exceeded")' max
  row "RSS MiB, client/server"     idle 'printf "%.1f/%.1f", f("c.rss_kb") / 1024, f("s.rss_kb") / 1024'
  echo "echo-all (one message on every connection)"
  row "answered"                   echo 'printf "%d/%d", f("done"), f("of")' min
  row "lost during echo"           echo 'printf "%d", f("lost")' max
  row "input backlog drops (kernel)" echo 'printf "%d", f("kernel.backlog_drops")' max
  row "seconds"                    echo 'printf "%.3f", f("seconds")'
  row "CPU ms, client"             echo 'printf "%.1f", f("c.cpu_ms")'
  row "CPU ms, server"             echo 'printf "%.1f", f("s.cpu_ms")'
  row "ack timeouts (ndwv)"        echo 'printf "%d", f("c.ack_timeouts") + f("s.ack_timeouts")' max
  if [ ${#crash[@]} -eq 0 ]; then
    echo "teardown, K = $k"
    row "disconnected"               teardown 'printf "%d/%d", f("done"), f("of")' min
    row "seconds"                    teardown 'printf "%.3f", f("seconds")'
    row "conn/s"                     teardown 'printf "%.0f", f("rate")'
    row "CPU s, client"              teardown 'printf "%.3f", f("c.cpu_ms") / 1000'
    row "CPU s, server"              teardown 'printf "%.3f", f("s.cpu_ms") / 1000'
  else
    echo "peer crash (the server killed; every connection's end reported)"
    row "reported ended"             crash 'printf "%d/%d", f("done"), f("of")' min
    row "seconds"                    crash 'printf "%.3f", f("seconds")'
    row "conn/s"                     crash 'printf "%.0f", f("rate")'
    row "CPU s, client"              crash 'printf "%.3f", f("c.cpu_ms") / 1000'
    row "retry exceeded (ndwv)"      crash 'printf "%d", f("c.retry_exceeded")' max
  fi
  echo "after release"
  row "descriptors, client/server" release 'printf "%d/%d", f("c.fds"), f("s.fds")' max
  echo "result"
  row "lost, client/server"        result 'printf "%d/%d", f("lost"), f("server_lost")' max
  row "connects failed"            result 'printf "%d", f("failed")' max
  row "ledger mismatches"          result 'printf "%d", f("mismatches")' max
  for f in "$logdir"/k$k-r*-*.txt; do
    if grep -q '^result: ok' "$f" 2>/dev/null; then continue; fi
    run=${f##*/k$k-}
    echo "${run%.txt}:"
    if grep -q '^result: FAILED' "$f"; then
      sed -n '/^result: FAILED/,$p' "$f" | sed 1d | sed 's/^ */  /'
      grep -E 'UNEXPECTED|NEVER|TWICE|MORE COMP' "$f" | sed 's/^ */    /'
    else
      grep -E '^error|watchdog' "$f" | sed 's/^/  /'
      echo "  (no result: see $f)"
    fi
  done
done
exit $status
