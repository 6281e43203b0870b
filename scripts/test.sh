#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds, runs every test, then builds and runs
# them again under AddressSanitizer + UndefinedBehaviorSanitizer (a separate build tree).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh build
(cd build && ctest --output-on-failure -j2 --timeout 300)
scripts/build.sh build-asan -DNDWV_SANITIZE=ON
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
   ctest --output-on-failure -j2 --timeout 300)
