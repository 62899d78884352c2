#!/usr/bin/env bash
# CTest: stagecraft_run on a function saved by make_saved_function: its .npy results equal, byte
# for byte, those of the original function; bad inputs exit 1 and usage errors 2, with a message.
# usage: test_run.sh <make_saved_function binary> <stagecraft_run binary> <work dir>
set -uo pipefail
make=$1 run=$2 dir=$3
rm -rf "$dir" && mkdir -p "$dir" || exit 1
"$make" "$dir" || { echo "FAIL: make_saved_function"; exit 1; }
fails=0
# expect <status> <regex in stdout+stderr> <args...>
expect() {
  local want=$1 re=$2; shift 2
  local out rc
  out=$("$run" "$@" 2>&1); rc=$?
  if [[ $rc -ne $want ]] || ! grep -qE -- "$re" <<<"$out"; then
    echo "FAIL: stagecraft_run $* -> status $rc (want $want), output:"; echo "$out"; fails=$((fails + 1))
  else
    echo "ok: stagecraft_run $* -> $rc"
  fi
}
expect 0 "^$dir/out0.npy: f32\[2, 4\]" "$dir/model.scg" "$dir/x.npy" "$dir/scale.npy" -o "$dir/out"
for i in 0 1; do
  if ! cmp -s "$dir/out$i.npy" "$dir/expected$i.npy"; then echo "FAIL: out$i.npy differs from expected$i.npy"; fails=$((fails + 1)); fi
done
(cd "$dir" && "$run" model.scg x.npy scale.npy >/dev/null) && cmp -s "$dir/output1.npy" "$dir/expected1.npy" ||
  { echo "FAIL: the default prefix"; fails=$((fails + 1)); }
expect 0 '^usage: stagecraft_run' --help
expect 2 '^usage: stagecraft_run'
expect 2 "unknown option '--bogus'" "$dir/model.scg" --bogus
expect 2 '-o needs a value' "$dir/model.scg" "$dir/x.npy" -o
expect 1 "'$dir/missing.scg': no such file" "$dir/missing.scg" "$dir/x.npy"
expect 1 "'$dir/nope.npy'.*no such file" "$dir/model.scg" "$dir/x.npy" "$dir/nope.npy"
expect 1 "takes 2 inputs \(f32\[2, 3\], f32\[4\]\), got 1" "$dir/model.scg" "$dir/x.npy"
expect 1 "input 0 \('$dir/wrong.npy'\) is f32\[3, 2\], the function takes f32\[2, 3\]" "$dir/model.scg" "$dir/wrong.npy" "$dir/scale.npy"
expect 1 "x.npy. is corrupt" "$dir/x.npy" "$dir/x.npy"
[[ $fails -eq 0 ]] && rm -rf "$dir"
exit $((fails > 0))
