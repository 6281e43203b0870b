#!/usr/bin/env bash
# Installs what ndwv needs on Debian 12 (idempotent; quiet when everything is present).
# `scripts/setup.sh fuzz` also installs what the fuzz targets need (scripts/fuzz.sh; the test
# run uses it). Why each package: see docs/dependencies.md.
set -euo pipefail
pkgs=(build-essential cmake pkg-config libisal-dev libsodium-dev libcli11-dev libgtest-dev libgmock-dev
      libbenchmark-dev python3 iproute2 tshark nftables)
if [ "${1:-}" = fuzz ]; then pkgs+=(clang libclang-rt-14-dev); fi
missing=()
for p in "${pkgs[@]}"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p"); done
if ((${#missing[@]})); then
  sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get update -qq
  # tshark (for the wire-format cross-checks) pulls in wireshark-common, which asks whether
  # non-root users may capture; answer no before it can ask.
  echo "wireshark-common wireshark-common/install-setuid boolean false" | $sudo debconf-set-selections
  # Through env: sudo drops the caller's environment, so a plain VAR=x prefix would not reach apt.
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
