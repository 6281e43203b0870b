#!/usr/bin/env bash
# Configures and builds one build tree: scripts/build.sh [--pgo] <dir> [cmake options...]
#   Options not given take their defaults (tests ON, sanitizers and fuzzers OFF), whatever the
#   tree's cache says.
#   --pgo  profile-guided: builds the library instrumented, trains it (scripts/pgo-train.sh),
#          then builds everything with the profile (CMakeLists.txt, NDWV_PGO).
set -euo pipefail
cd "$(dirname "$0")/.."
pgo=OFF
if [ "${1:-}" = --pgo ]; then pgo=USE; shift; fi
dir=$1; shift
mkdir -p "$dir"
profile=$(cd "$dir" && pwd)/pgo-profile
# Every option is given on each configure (the caller's come last and win): a tree configured
# before by another script keeps nothing of that script's choices in its cache.
configure() {
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DNDWV_PGO_DIR="$profile" \
    -DNDWV_TESTS=ON -DNDWV_SANITIZE=OFF -DNDWV_TSAN=OFF -DNDWV_FUZZ=OFF "$@" >/dev/null
}
if [ $pgo = USE ]; then
  configure "$@" -DNDWV_PGO=GENERATE
  rm -rf "$profile"  # counts from an older training would be merged into the new ones
  cmake --build "$dir" -j2 --target ndpingpong ndrpingpong ndrping ndping nd1pingpong
  scripts/pgo-train.sh "$dir"
fi
configure "$@" -DNDWV_PGO=$pgo
cmake --build "$dir" -j2
