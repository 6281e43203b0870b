#!/usr/bin/env bash
# Builds every libFuzzer target (tests/fuzz; clang) and runs each for a while:
#   scripts/fuzz.sh [seconds per target, default 20]
# Each run starts from an empty corpus, with the target's dictionary when there is one
# (tests/fuzz/<name>.dict, else tests/fuzz/<last word of the name>.dict). A finding stops the
# script, the reproducer left in build-fuzz/findings/. Long runs: tests/fuzz/CMakeLists.txt.
# The tree also compiles the whole library (ndwv: every layer) with clang, whose
# thread-safety analysis fails the build on a locking violation (CMakeLists.txt,
# docs/architecture.md "Locking").
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-20}
CC=clang CXX=clang++ cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DNDWV_FUZZ=ON \
  -DNDWV_TESTS=OFF >/dev/null
cmake --build build-fuzz -j2 --target fuzz_targets ndwv
mkdir -p build-fuzz/findings
for target in $(find build-fuzz/tests/fuzz -maxdepth 1 -type f -executable -name 'fuzz_*' | sort); do
  name=$(basename "$target")
  short=${name#fuzz_}
  short=${short#wire_}
  args=(-max_total_time="$seconds" -artifact_prefix=build-fuzz/findings/"$name"-)
  for dict in tests/fuzz/"$short".dict tests/fuzz/"${short##*_}".dict; do
    if [ -f "$dict" ]; then args+=(-dict="$dict"); break; fi
  done
  corpus=$(mktemp -d)
  log=build-fuzz/findings/"$name".log
  echo "== $name (${seconds} s)"
  status=0
  "$target" "${args[@]}" "$corpus" >"$log" 2>&1 || status=$?
  rm -rf "$corpus"
  grep -E "^#[0-9]+[[:space:]]+DONE" "$log" || true
  if [ "$status" != 0 ]; then
    tail -n 60 "$log" >&2
    echo "$name found a failure (exit $status): build-fuzz/findings/" >&2
    exit 1
  fi
done
