#!/usr/bin/env bash
# Builds Microsoft's NetworkDirect SDK programs (the examples and unit tests of
# github.com/microsoft/NetworkDirect) from their unmodified sources, on Linux, against an
# installed ndwv found by pkg-config, with this folder's platform shim (shim/) supplying the
# Windows calls ndwv does not:
#
#   tests/ms-sdk/build.sh <SDK checkout> <output dir>
#
# <SDK checkout> is the repository's top (the one holding src/examples and src/unittests);
# nothing of it is copied into this project. PKG_CONFIG_PATH must find ndwv.pc (an installed
# ndwv: `cmake --install build --prefix P`, then P/lib/pkgconfig). Each program becomes
# <output dir>/<name>; the compiler's messages go to <output dir>/<name>.log. Prints one line per
# program (built / FAILED) and exits non-zero if any failed.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
if [ $# -ne 2 ]; then
  echo "usage: $0 <NetworkDirect SDK checkout> <output dir>" >&2
  exit 2
fi
sdk=$(cd "$1" && pwd)/src
out=$2
mkdir -p "$out"
out=$(cd "$out" && pwd)
if [ ! -d "$sdk/examples" ] || [ ! -d "$sdk/unittests" ]; then
  echo "$1 is not a NetworkDirect SDK checkout (no src/examples, src/unittests)" >&2
  exit 2
fi
if ! pkg-config --exists ndwv; then
  echo "pkg-config finds no ndwv: set PKG_CONFIG_PATH to an installed ndwv's lib/pkgconfig" >&2
  exit 2
fi

CXX=${CXX:-c++}
libdir=$(pkg-config --variable=libdir ndwv)
# The SDK's sources say <ndspi.h>, <ndsupport.h>, <ndstatus.h> as on Windows: ndwv's headers
# directory comes before the SDK's own folders, so that ndwv's declarations are the ones used
# (the SDK's examples/ndsupport.h is Microsoft's declaration of the same helper calls).
# TODO(headers): drop the include/ndwv entry once `pkg-config --cflags ndwv` provides it.
ndwv_headers=$(pkg-config --variable=includedir ndwv)/ndwv
# MS_SDK_FLAGS: more compiler and linker flags (the sanitizers, to match an instrumented ndwv).
extra=(${MS_SDK_FLAGS:-})
flags=("${extra[@]}" -std=c++20 -pthread -w -I"$here/shim" -I"$ndwv_headers" $(pkg-config --cflags ndwv)
       -I"$sdk/examples" -I"$sdk/examples/ndtestutil")
libs=("${extra[@]}" $(pkg-config --libs ndwv) -Wl,-rpath,"$libdir" -pthread)

# name : sources relative to src/ : optimisation. ndrpingpong waits for the peer's RDMA Write by
# reading a byte of ordinary (not volatile) memory in a loop, which an optimiser may hoist: -O0.
programs=(
  "ndadapterinfo:examples/ndadapterinfo/ndadapterinfo.cpp:-O2"
  "ndcat:examples/ndcat/ndcat.cpp:-O2"
  "ndping:examples/ndping/ndping.cpp:-O2"
  "ndpingpong:examples/ndpingpong/ndpingpong.cpp:-O2"
  "ndrping:examples/ndrping/ndrping.cpp:-O2"
  "ndrpingpong:examples/ndrpingpong/ndrpingpong.cpp:-O0"
  "ndmrlat:examples/ndmrlat/ndmrlat.cpp:-O2"
  "ndmrrate:examples/ndmrrate/ndmrrate.cpp:-O2"
  "ndconn:unittests/ndconn/ndconn.cpp:-O2"
  "ndcq:unittests/ndcq/ndcq.cpp:-O2"
  "ndmemorytest:unittests/ndmemorytest/*.cpp:-O2"
  "ndmw:unittests/ndmw/ndmw.cpp:-O2"
  "ndmpic:unittests/ndmpic/ndmpic.cpp:-O2"
  "ndmval:unittests/ndmval/ndmval.cpp:-O2"
)

# The shim and the SDK's shared test helpers, once.
failed=0
compile() {  # object source optimisation
  "$CXX" "$3" -g "${flags[@]}" -c "$2" -o "$1"
}
if ! { compile "$out/windows_shim.o" "$here/shim/windows_shim.cpp" -O2 &&
       compile "$out/ndtestutil.o" "$sdk/examples/ndtestutil/ndtestutil.cpp" -O2; } > "$out/common.log" 2>&1; then
  echo "the shim or ndtestutil did not compile: $out/common.log" >&2
  cat "$out/common.log" >&2
  exit 1
fi
for entry in "${programs[@]}"; do
  IFS=: read -r name sources level <<< "$entry"
  (
    set -e
    objects=()
    for source in $sdk/$sources; do
      object="$out/$name.$(basename "$source" .cpp).o"
      compile "$object" "$source" "$level"
      objects+=("$object")
    done
    "$CXX" "${objects[@]}" "$out/ndtestutil.o" "$out/windows_shim.o" "${libs[@]}" -o "$out/$name"
  ) > "$out/$name.log" 2>&1
  if [ $? -eq 0 ]; then
    echo "built   $name"
  else
    echo "FAILED  $name (see $out/$name.log)"
    failed=1
  fi
done
exit $failed
