#!/bin/sh
# docs/configuration.md is generated from the settings table (src/base/settings.cpp) by
# `ndinfo --env --markdown`. This script regenerates it and compares:
#   configuration.sh <ndinfo> <docs/configuration.md>            fails (exit 1) if they differ
#   configuration.sh <ndinfo> <docs/configuration.md> --update   rewrites the file
set -eu
ndinfo=$1
doc=$2
mode=${3:-check}
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
timeout 30 "$ndinfo" --env --markdown > "$tmp"
if [ "$mode" = --update ]; then
  cp "$tmp" "$doc"
  echo "wrote $doc"
  exit 0
fi
if ! diff -u "$doc" "$tmp"; then
  echo "docs/configuration.md is stale: the settings table changed. Regenerate it with" >&2
  echo "  cmake --build <build dir> --target configuration-doc" >&2
  exit 1
fi
echo "docs/configuration.md matches the settings table"
