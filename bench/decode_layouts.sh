#!/usr/bin/env bash
# Decoding on tensor- and pipeline-parallel ranks, each holding only its share of the
# weights (infer::ShardWeights): tokens/s, the weights the fullest rank holds, and the
# largest rank's peak tracked memory and resident set, for one rank, tp 2, pp 2 and
# tp 2 x pp 2 (8 prompts x 32 greedy tokens, one thread per rank; 4 ranks oversubscribe a
# 2-core machine). The model is trained for one step here.
# Usage: bench/decode_layouts.sh [MODEL (gpt2-124m)]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="$root/build/meshtrain"
data="$root/data/brown"
model="${1:-gpt2-124m}"
[ -f "$data/train.bin" ] || "$bin" prep --brown --out "$data" >/dev/null
out="$(mktemp -d /tmp/meshtrain_bench_layouts.XXXXXX)"
trap 'rm -rf "$out"' EXIT
"$bin" train --data "$data" --model "$model" --seq-len 64 --micro-batch 1 --steps 1 --eval-batches 1 --quiet \
  --out "$out/run" >/dev/null
for i in 1 2 3 4 5 6 7 8; do echo "The jury said that the city number $i"; done > "$out/prompts.txt"
echo "$(nproc) cores; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); $model"
printf "%-12s %9s %16s %16s %16s\n" layout "tokens/s" "weights held MB" "peak tracked MB" "peak RSS MB"
reference=""
for layout in "" "--tp 2" "--pp 2" "--tp 2 --pp 2"; do
  # --memory-budget far above the weights: nothing streams, and the memory line is printed.
  "$bin" generate --checkpoint "$out/run" --prompts "$out/prompts.txt" --max-new-tokens 32 --temperature 0 --json \
    --threads 1 --batch 8 --memory-budget 100 $layout >"$out/gen.json" 2>"$out/gen.err"
  [ -z "$reference" ] && reference="$(cat "$out/gen.json")"
  [ "$(cat "$out/gen.json")" == "$reference" ] || { echo "layout '$layout' printed other text" >&2; exit 1; }
  python3 - "${layout:-one rank}" "$out/gen.err" <<'PY'
import re, sys
layout, err = sys.argv[1:]
text = open(err).read()
peak = re.search(r"peak ([0-9.]+) MB tracked", text).group(1)
rss = re.search(r"peak resident set ([0-9.]+) MB", text).group(1)
rate = re.search(r"decoding: .*\(([0-9.]+) tokens/s\)", text).group(1)
held = re.search(r"weights held: ([0-9.]+) MB", text)
whole = re.search(r"of ([0-9.]+) MB; decoding", text)
held = f"{held.group(1)} of {whole.group(1)}" if held else "all"
print(f"{layout:<12} {rate:>9} {held:>16} {peak:>16} {rss:>16}")
PY
done
