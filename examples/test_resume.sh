#!/usr/bin/env bash
# CTest: 2 epochs in one run == 1 epoch saved + 1 epoch resumed (same printed per-epoch losses).
# usage: test_resume.sh <fashion_mnist binary> <data dir> <scratch dir>; exits 77 (skip) without the data.
set -euo pipefail
bin=$1 data=$2 dir=$3
if [[ ! -f $data/train-images-idx3-ubyte.gz ]]; then
  echo "SKIP: no Fashion-MNIST under $data (apt-get install dataset-fashion-mnist)"
  exit 77
fi
mkdir -p "$dir"
rm -f "$dir/ckpt.safetensors"
common=(--data "$data" --limit 2000 --batch 64 --seed 7)
losses() { grep -o '^epoch [0-9]* loss=[0-9.]*' || true; }

full=$("$bin" "${common[@]}" --epochs 2 2>/dev/null | losses)
part1=$("$bin" "${common[@]}" --epochs 1 --save "$dir/ckpt.safetensors" 2>/dev/null | losses)
part2=$("$bin" "${common[@]}" --epochs 2 --resume "$dir/ckpt.safetensors" 2>/dev/null | losses)
joined=$(printf '%s\n%s' "$part1" "$part2")

echo "uninterrupted:"; echo "$full"
echo "saved + resumed:"; echo "$joined"
if [[ $(echo "$full" | wc -l) -ne 2 ]]; then echo "FAIL: expected 2 epoch lines"; exit 1; fi
if [[ "$full" != "$joined" ]]; then echo "FAIL: per-epoch losses differ after resume"; exit 1; fi
echo "PASS"
