#!/usr/bin/env bash
# usage: umbrella_emission.sh OBJECT MAX
# Fails when OBJECT (test/link/umbrella_only.cpp, compiled) defines more than MAX functions.
set -euo pipefail
obj=$1 max=$2
count=$(nm --defined-only "$obj" | grep -c ' [TtWw] ' || true)
echo "umbrella_only: ${count} functions defined (at most ${max})"
if (( count > max )); then
  echo "a header emits code in every file that includes it; the largest:" >&2
  nm -C --defined-only --size-sort --reverse-sort "$obj" | grep ' [TtWw] ' | head -20 >&2 || true
  exit 1
fi
