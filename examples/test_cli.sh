#!/usr/bin/env bash
# CTest: fashion_mnist's command line — usage errors exit 2 with the usage text, missing data
# exits 1 naming the package to install.
# usage: test_cli.sh <fashion_mnist binary>
set -uo pipefail
bin=$1
fails=0
# expect <status> <regex in stderr+stdout> <args...>
expect() {
  local want=$1 re=$2; shift 2
  local out rc
  out=$("$bin" "$@" 2>&1); rc=$?
  if [[ $rc -ne $want ]] || ! grep -qE -- "$re" <<<"$out"; then
    echo "FAIL: fashion_mnist $* -> status $rc (want $want), output:"; echo "$out"; fails=$((fails + 1))
  else
    echo "ok: fashion_mnist $* -> $rc"
  fi
}
expect 0 '^usage: fashion_mnist' --help
expect 2 "unknown option '--bogus'" --bogus
expect 2 "unknown option 'stray'" stray
expect 2 '--model expects mlp or cnn' --model rnn
expect 2 '--mode expects eager, staged or graph' --mode=fast
expect 2 '--epochs expects an integer >= 1' --epochs 0
expect 2 '--epochs expects a non-negative integer' --epochs 3x
expect 2 '--batch expects a non-negative integer' --batch -5
expect 2 '--limit needs a value' --limit
expect 2 '--test-limit expects an integer >= 1' --test-limit 0
expect 2 '--seed expects a non-negative integer' --seed abc
expect 2 'usage: fashion_mnist' --epochs
expect 2 '--threads expects auto or an integer from 1 to 4096' --threads 0
expect 2 "--threads expects auto or an integer from 1 to 4096, got 'many'" --threads=many
expect 2 '--threads expects auto or an integer from 1 to 4096' --threads 5000
expect 1 'apt-get install dataset-fashion-mnist' --data /nonexistent/fashion-mnist
expect 2 '--device expects cpu, cuda or cuda:N' --device tpu
expect 2 '--device expects cpu, cuda or cuda:N' --device cuda:x
# A GPU that is not there (this build has no CUDA, or no such device): exit 1 before reading data.
expect 1 'cannot use cuda:1000' --device cuda:1000 --data /nonexistent/fashion-mnist
[[ $fails -eq 0 ]] && echo PASS || { echo "$fails failure(s)"; exit 1; }
