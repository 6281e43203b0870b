#!/usr/bin/env bash
# Microsoft's NetworkDirect SDK programs, unmodified, on this build of ndwv (CTest
# ms_sdk_programs): installs the build tree into a temporary prefix, builds the programs against
# it with build.sh, and runs them with run.sh on both transports.
#
#   check.sh <build dir> [SDK checkout]       (the checkout defaults to $NDWV_MS_SDK)
#
# Without a checkout it skips (exit 77): the project holds none of Microsoft's code and CI has no
# network. Get one with `git clone https://github.com/microsoft/NetworkDirect`.
# MS_SDK_ONLY (see run.sh) narrows the cases; the temporary directory is removed on exit.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
if [ $# -lt 1 ]; then
  echo "usage: $0 <build dir> [NetworkDirect SDK checkout]" >&2
  exit 2
fi
build=$(cd "$1" && pwd)
sdk=${2:-${NDWV_MS_SDK:-}}
if [ -z "$sdk" ]; then
  echo "SKIPPED: no NetworkDirect SDK checkout given (set NDWV_MS_SDK to a clone of"
  echo "https://github.com/microsoft/NetworkDirect to build and run Microsoft's programs)"
  exit 77
fi
if [ ! -d "$sdk/src/examples" ]; then
  echo "NDWV_MS_SDK=$sdk is not a NetworkDirect SDK checkout (no src/examples)" >&2
  exit 2
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/ndwv-ms-sdk.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
echo "== cmake --install $build --prefix $tmp/prefix"
timeout -k 5 120 cmake --install "$build" --prefix "$tmp/prefix" > "$tmp/install.log" ||
  { cat "$tmp/install.log"; exit 1; }
PKG_CONFIG_PATH=$(dirname "$(find "$tmp/prefix" -name ndwv.pc -path '*/pkgconfig/*' | head -n 1)")
export PKG_CONFIG_PATH
echo "== build.sh $sdk"
"$here/build.sh" "$sdk" "$tmp/programs"
echo "== run.sh"
"$here/run.sh" "$tmp/programs" iwarp roce
