#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds (profile-guided, as the demo and the
# benchmarks build: what is tested is what runs), runs every test, then builds and runs them again
# under AddressSanitizer + UndefinedBehaviorSanitizer (a separate build tree, no profile), and
# last runs every fuzz target for 20 seconds (scripts/fuzz.sh; clang, a tree of its own).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh fuzz
# The options are explicit (build/ may hold the demo's tests-off configuration), and a ctest
# that finds no tests fails instead of passing on nothing.
scripts/build.sh --pgo build -DNDWV_TESTS=ON -DNDWV_SANITIZE=OFF
(cd build && ctest --no-tests=error --output-on-failure -j2 --timeout 300)
scripts/build.sh build-asan -DNDWV_TESTS=ON -DNDWV_SANITIZE=ON
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
   ctest --no-tests=error --output-on-failure -j2 --timeout 300)
scripts/fuzz.sh 20
