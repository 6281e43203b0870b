#!/usr/bin/env bash
# Configures and builds one build tree: scripts/build.sh [--pgo] <dir> [cmake options...]
#   --pgo  profile-guided: builds the library instrumented, trains it (scripts/pgo-train.sh),
#          then builds everything with the profile (CMakeLists.txt, NDWV_PGO).
set -euo pipefail
cd "$(dirname "$0")/.."
pgo=OFF
if [ "${1:-}" = --pgo ]; then pgo=USE; shift; fi
dir=$1; shift
mkdir -p "$dir"
profile=$(cd "$dir" && pwd)/pgo-profile
configure() {
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DNDWV_PGO_DIR="$profile" "$@" >/dev/null
}
if [ $pgo = USE ]; then
  configure "$@" -DNDWV_PGO=GENERATE
  rm -rf "$profile"  # counts from an older training would be merged into the new ones
  cmake --build "$dir" -j2 --target ndpingpong ndrpingpong ndrping ndping nd1pingpong
  scripts/pgo-train.sh "$dir"
fi
configure "$@" -DNDWV_PGO=$pgo
cmake --build "$dir" -j2
