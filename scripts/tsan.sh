#!/usr/bin/env bash
# The whole test suite under ThreadSanitizer: builds the tree build-tsan (-DNDWV_TSAN=ON, -O1)
# and runs every test in it. Any report fails its test (halt_on_error); the only reports let
# through are the false positives listed, each with its reason, in tests/tsan.supp. Too slow for
# CI's scripts/test.sh: a nightly command (time: docs/architecture.md, "Locking").
#   scripts/tsan.sh [ctest options...]   e.g. -R 'roce\.' to run a part of the suite
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh build-tsan -DNDWV_TSAN=ON
# Peers and tools started by the tests inherit the options. second_deadlock_stack: a
# lock-order report shows where both locks were taken.
export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$PWD/tests/tsan.supp${TSAN_OPTIONS:+ $TSAN_OPTIONS}"
cd build-tsan
ctest --no-tests=error --output-on-failure -j2 --timeout 600 "$@"
