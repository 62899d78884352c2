#!/usr/bin/env bash
# Installs stagecraft's build dependencies (Debian 12 packages), only those that are missing.
# Usage: bash cmake/install-deps.sh [--bench-extras]
#   --bench-extras  also install libtorch-dev (only the optional LibTorch comparison benchmarks use it)
# Idempotent: when everything is present it changes nothing and never touches the network.
set -euo pipefail

packages=(cmake ninja-build g++ xtensor-dev libxsimd-dev xtl-dev libopenblas-openmp-dev
          catch2 libbenchmark-dev zlib1g-dev nlohmann-json3-dev dataset-fashion-mnist pkg-config)
bench_extras=(libtorch-dev)

die() { echo "install-deps: error: $*" >&2; exit 1; }

for arg in "$@"; do
  case "$arg" in
    --bench-extras) packages+=("${bench_extras[@]}") ;;
    -h|--help) sed -n '2,5s/^# \{0,1\}//p' "$0"; exit 0 ;;
    *) die "unknown argument '$arg' (expected --bench-extras)" ;;
  esac
done

command -v dpkg-query >/dev/null || die "dpkg-query not found: this script is for Debian/Ubuntu"

# A package counts as present only when dpkg says "install ok installed" (not merely known).
missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$p")
done

if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#packages[@]} packages already installed"
  exit 0
fi

# Root runs apt-get directly; others go through sudo (non-interactive when there is no terminal,
# so CI fails with a message instead of hanging on a password prompt).
if [[ $(id -u) -eq 0 ]]; then
  as_root=()
elif command -v sudo >/dev/null; then
  if [[ -t 0 ]]; then as_root=(sudo); else as_root=(sudo -n); fi
else
  die "need root to install: ${missing[*]} (run as root, or install sudo)"
fi

echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q \
  || die "apt-get update failed"
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" \
  || die "apt-get install failed for: ${missing[*]}"
echo "install-deps: done"
