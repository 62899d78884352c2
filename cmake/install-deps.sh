#!/usr/bin/env bash
# Installs stagecraft's build dependencies (Debian 12, Debian 13 or Ubuntu 24.04 packages), only
# those that are missing.
# Usage: bash cmake/install-deps.sh [--bench-extras]
#   --bench-extras  also install libtorch-dev (only the optional LibTorch comparison benchmarks use it)
# Idempotent: when everything is present it changes nothing and never touches the network.
set -euo pipefail

packages=(cmake ninja-build g++ xtensor-dev libxsimd-dev xtl-dev libopenblas-openmp-dev
          catch2 libbenchmark-dev zlib1g-dev nlohmann-json3-dev dataset-fashion-mnist pkg-config)
bench_extras=(libtorch-dev)
# Not in every distribution: installed where apt offers it, else skipped with a note. (Ubuntu has
# no dataset-fashion-mnist: the example's data tests then skip; -DSTAGECRAFT_FASHION_MNIST_DIR
# points them at a copy of the IDX files.)
optional=(dataset-fashion-mnist)
# A stand-in where a distribution lacks the package (name:substitute).
substitutes=(libopenblas-openmp-dev:libopenblas-dev)

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
installed() { [[ $(dpkg-query -W -f='${Status}' "$1" 2>/dev/null || true) == "install ok installed" ]]; }
# Whether apt's package lists (on disk: no network) offer a version of it.
offered() {
  local c
  c=$(apt-cache policy "$1" 2>/dev/null | sed -n 's/^ *Candidate: //p')
  [[ -n "$c" && "$c" != "(none)" ]]
}
is_optional() { [[ " ${optional[*]} " == *" $1 "* ]]; }
substitute_of() {
  local s
  for s in "${substitutes[@]}"; do [[ "${s%%:*}" == "$1" ]] && echo "${s#*:}"; done
  return 0
}

missing=()
for p in "${packages[@]}"; do
  installed "$p" && continue
  sub=$(substitute_of "$p")
  [[ -n "$sub" ]] && installed "$sub" && continue
  missing+=("$p")
done

# Nothing required is missing and apt does not offer the optional ones: done, without the network.
required_missing=0
for p in "${missing[@]}"; do
  if is_optional "$p" && ! offered "$p"; then continue; fi
  required_missing=1
done
if ((required_missing == 0)); then
  for p in "${missing[@]}"; do echo "install-deps: note: $p is not offered by this distribution, skipped"; done
  echo "install-deps: all $((${#packages[@]} - ${#missing[@]})) packages needed already installed"
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

export DEBIAN_FRONTEND=noninteractive
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q \
  || die "apt-get update failed"
# With fresh package lists: optional packages apt does not offer are skipped, substitutes stand
# in for packages it does not offer, and a required package it does not offer is an error.
wanted=() unavailable=()
for p in "${missing[@]}"; do
  if offered "$p"; then wanted+=("$p")
  elif is_optional "$p"; then echo "install-deps: note: $p is not offered by this distribution, skipped"
  elif sub=$(substitute_of "$p") && [[ -n "$sub" ]] && offered "$sub"; then wanted+=("$sub")
  else unavailable+=("$p")
  fi
done
((${#unavailable[@]} == 0)) || die "apt offers no ${unavailable[*]} (enable the distribution's main/universe components?)"
missing=("${wanted[@]}")
((${#missing[@]})) || { echo "install-deps: done"; exit 0; }
echo "install-deps: installing ${missing[*]}"
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" \
  || die "apt-get install failed for: ${missing[*]}"
echo "install-deps: done"
