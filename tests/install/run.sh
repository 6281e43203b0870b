#!/usr/bin/env bash
# The install test: installs an already-built ndwv tree into a temporary prefix and uses it the way
# a consumer would.
#
#   run.sh <build dir> <source dir>
#
# 1. cmake --install <build dir> --prefix <tmp>/prefix; the headers, library, tools, pkg-config
#    file and CMake package must be there.
# 2. The consumer (tests/install/consumer) built with g++ and `pkg-config --cflags --libs ndwv`,
#    run with no LD_LIBRARY_PATH (rpath): main.cpp (which includes <ndspi.h> and <ndsupport.h>
#    by their Windows names) must print OK, hello.cpp (the user guide's program, <ndwv/...>)
#    must exchange its messages as a server and a client process, on iWARP and RoCE; the C
#    program tests/c_api/open_adapter.c, built as C11 with gcc and with clang (when present),
#    must print OK on iWARP and RoCE.
# 3. The same consumers built with CMake, find_package(ndwv), and run the same way.
# 4. The installed tools run from the prefix with no environment help (their rpath).
# 5. The user guide's code is this code: its hello.cpp and CMakeLists.txt blocks equal the files
#    here, and every other C++ block in it compiles against the installed headers.
#
# NDWV_CONSUMER_FLAGS (set by CTest in a sanitizer build) is added to the consumer's compiler
# flags. Every step is bounded by `timeout`; the temporary directory is removed on exit.
set -euo pipefail

if [ $# -ne 2 ]; then
  echo "usage: $0 <build dir> <source dir>" >&2
  exit 2
fi
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
consumer_src="$src/tests/install/consumer"
guide="$src/docs/user-guide.md"
flags=${NDWV_CONSUMER_FLAGS:-}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/ndwv-install.XXXXXX")
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT

step() { echo "== $*"; }
fail() {
  echo "FAIL: $*" >&2
  exit 1
}
bounded() { timeout -k 5 "$@"; }  # bounded <seconds> command...

# ---- 1. install -------------------------------------------------------------------------------
prefix="$tmp/prefix"
step "cmake --install $build --prefix $prefix"
bounded 120 cmake --install "$build" --prefix "$prefix" > "$tmp/install.log" || {
  cat "$tmp/install.log"
  fail "cmake --install"
}
for header in ndspi.h ndsupport.h ndstatus.h win32.h winverbs.h wvstatus.h ndwv.h \
              sdk/ndspi.h sdk/ndsupport.h sdk/ndstatus.h sdk/nddef.h; do
  [ -f "$prefix/include/ndwv/$header" ] || fail "not installed: include/ndwv/$header"
done
for tool in ndinfo ndpingpong ndrpingpong ndrping ndping ndmrlat ndmrrate ndcat ndadapterinfo \
            ndconn nd1pingpong nd1rpingpong nd1rping; do
  [ -x "$prefix/bin/$tool" ] || fail "not installed: bin/$tool"
done
pc=$(find "$prefix" -name ndwv.pc -path '*/pkgconfig/*' | head -n 1)
[ -n "$pc" ] || fail "not installed: ndwv.pc"
config=$(find "$prefix" -name ndwvConfig.cmake | head -n 1)
[ -n "$config" ] || fail "not installed: ndwvConfig.cmake"
echo "pkg-config file: ${pc#"$prefix"/}, CMake package: ${config#"$prefix"/}"

# Runs hello as a server and a client on 127.0.0.1 with the given transport.
run_hello() {  # run_hello <hello binary> <transport> <environment...>
  local hello=$1 transport=$2
  shift 2
  local out="$tmp/hello-$transport"
  : > "$out.server"
  env "$@" NDWV_TRANSPORTS="$transport" timeout -k 5 60 "$hello" server 127.0.0.1 \
    > "$out.server" 2>&1 &
  local server=$!
  pids+=("$server")
  local port=""
  for _ in $(seq 1 200); do  # up to 20 s for the server to listen
    port=$(sed -n 's/^listening on port \([0-9]*\)$/\1/p' "$out.server")
    [ -n "$port" ] && break
    kill -0 "$server" 2>/dev/null || break
    sleep 0.1
  done
  [ -n "$port" ] || { cat "$out.server"; fail "hello server ($transport) did not listen"; }
  if ! env "$@" NDWV_TRANSPORTS="$transport" timeout -k 5 60 "$hello" client 127.0.0.1 "$port" \
      > "$out.client" 2>&1; then
    cat "$out.client"
    fail "hello client ($transport)"
  fi
  wait "$server" || { cat "$out.server"; fail "hello server ($transport)"; }
  grep -qx "server received: hello" "$out.server" || { cat "$out.server"; fail "hello server output"; }
  grep -qx "client received: world" "$out.client" || { cat "$out.client"; fail "hello client output"; }
  echo "hello on $transport: $(tr '\n' ' ' < "$out.server")/ $(cat "$out.client")"
}

c_program="$src/tests/c_api/open_adapter.c"
run_c_consumer() {  # run_c_consumer <binary>: on each transport
  local transport
  for transport in iwarp roce; do run_consumer "$1" NDWV_TRANSPORTS=$transport; done
}

run_consumer() {  # run_consumer <consumer binary> <environment...>
  local consumer=$1
  shift
  local out
  out=$(env "$@" timeout -k 5 60 "$consumer" 2>&1) || { echo "$out"; fail "$consumer"; }
  echo "$out"
  [ "$(echo "$out" | tail -n 1)" = OK ] || fail "$consumer did not print OK"
}

# ---- 2. pkg-config ----------------------------------------------------------------------------
step "build with pkg-config"
export PKG_CONFIG_PATH="$(dirname "$pc")"
cflags=$(pkg-config --cflags ndwv)
libs=$(pkg-config --libs ndwv)
libdir=$(pkg-config --variable=libdir ndwv)
echo "pkg-config --cflags --libs ndwv: $cflags $libs"
mkdir -p "$tmp/pc"
# As docs/user-guide.md builds it: the rpath finds the installed library at run time.
for program in main hello; do
  # shellcheck disable=SC2086  # the flags are word lists
  bounded 300 g++ $flags "$consumer_src/$program.cpp" $cflags $libs -Wl,-rpath,"$libdir" \
    -o "$tmp/pc/$program"
done
run_consumer "$tmp/pc/main"
for transport in iwarp roce; do run_hello "$tmp/pc/hello" "$transport"; done
c_compilers=(gcc)
command -v clang > /dev/null && c_compilers+=(clang)
for cc in "${c_compilers[@]}"; do
  if [ "$cc" = clang ] && [ -n "$flags" ]; then
    # A sanitizer build's library carries gcc's runtime, which a clang program cannot share:
    # clang only compiles the program there.
    # shellcheck disable=SC2086
    bounded 300 clang -std=c11 -Wall -Wextra -Wpedantic -Werror -fsyntax-only "$c_program" $cflags
    echo "C program compiled with clang (not run: the library's sanitizer runtime is gcc's)"
    continue
  fi
  # shellcheck disable=SC2086
  bounded 300 "$cc" -std=c11 -Wall -Wextra -Wpedantic -Werror $flags "$c_program" $cflags $libs \
    -ldl -Wl,-rpath,"$libdir" -o "$tmp/pc/c-$cc"
  echo "C program built with $cc:"
  run_c_consumer "$tmp/pc/c-$cc"
done

# ---- 3. find_package --------------------------------------------------------------------------
step "build with find_package(ndwv)"
unset PKG_CONFIG_PATH
bounded 120 cmake -S "$consumer_src" -B "$tmp/cmake" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_C_FLAGS="$flags" > "$tmp/cmake.log" 2>&1 || { cat "$tmp/cmake.log"; fail "configure"; }
bounded 300 cmake --build "$tmp/cmake" > "$tmp/cmake-build.log" 2>&1 ||
  { cat "$tmp/cmake-build.log"; fail "build"; }
run_consumer "$tmp/cmake/consumer"  # CMake's build-tree rpath finds the installed library
run_c_consumer "$tmp/cmake/c_consumer"
for transport in iwarp roce; do run_hello "$tmp/cmake/hello" "$transport"; done

# ---- 4. installed tools -----------------------------------------------------------------------
step "installed tools"
bounded 30 "$prefix/bin/ndinfo" --env > "$tmp/ndinfo.out" 2>&1 ||
  { cat "$tmp/ndinfo.out"; fail "ndinfo --env"; }
grep -q NDWV_TRANSPORTS "$tmp/ndinfo.out" || fail "ndinfo --env does not list NDWV_TRANSPORTS"
bounded 30 "$prefix/bin/ndinfo" 127.0.0.1 > "$tmp/ndinfo.out" 2>&1 ||
  { cat "$tmp/ndinfo.out"; fail "ndinfo 127.0.0.1"; }
echo "ndinfo --env and ndinfo 127.0.0.1 ran from $prefix/bin"

# ---- 5. the user guide's code -----------------------------------------------------------------
step "the code in docs/user-guide.md"
mkdir -p "$tmp/guide"
# A fenced block right after a line "<!-- file: <path> -->" must equal <path>, one after
# "<!-- file-start: <path> -->" the beginning of <path>; every other ```cpp block must compile on
# its own.
awk -v dir="$tmp/guide" '
  /^<!-- file(-start)?: .* -->$/ { marked = $3; kind = ($2 == "file:" ? "whole" : "start"); next }
  /^```/ && !inside {
    inside = 1
    if (marked != "") { name = marked; gsub("/", "%", name); out = dir "/" kind "." name }
    else if ($0 == "```cpp") out = dir "/snippet." (++n) ".cpp"
    else out = ""
    marked = ""
    next
  }
  /^```/ && inside { inside = 0; if (out != "") close(out); out = ""; next }
  inside && out != "" { print > out }
  NF && !inside { marked = "" }
' "$guide"
checked=0
for block in "$tmp"/guide/whole.* "$tmp"/guide/start.*; do
  [ -e "$block" ] || continue
  name=${block#"$tmp"/guide/*.}
  name=${name//%//}
  if [ "${block#"$tmp"/guide/start.}" != "$block" ]; then
    head -n "$(wc -l < "$block")" "$src/$name" > "$tmp/guide/expected"
  else
    cp "$src/$name" "$tmp/guide/expected"
  fi
  diff -u "$tmp/guide/expected" "$block" ||
    fail "docs/user-guide.md shows $name differently from the file"
  checked=$((checked + 1))
done
for snippet in "$tmp"/guide/snippet.*.cpp; do
  [ -e "$snippet" ] || continue
  # shellcheck disable=SC2086
  bounded 120 g++ -std=c++17 -fsyntax-only -I"$prefix/include" -I"$prefix/include/ndwv/sdk" \
    "$snippet" ||
    { cat -n "$snippet"; fail "a C++ block of docs/user-guide.md does not compile"; }
  checked=$((checked + 1))
done
[ -e "$tmp/guide/whole.tests%install%consumer%hello.cpp" ] ||
  fail "docs/user-guide.md does not show tests/install/consumer/hello.cpp"
echo "$checked blocks of the user guide checked"

echo "PASS"
