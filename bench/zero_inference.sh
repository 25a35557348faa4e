#!/usr/bin/env bash
# ZeRO-Inference on this machine: generation with the layers' weights streamed from a file
# (--offload weights=nvme, O_DIRECT) against the model in memory, on GPT-2 124M (trained for
# one step here: 154 MB of embedding, which stays in memory, and 12 layers of 28 MB, 340 MB).
# For batches of 1 and 8 prompts (32 new tokens each, one thread) it prints tokens/s, the
# peak tracked memory and the peak resident set (the process's, libraries included): in memory, then streamed reading 0, 1 and 2 layers ahead under a
# --memory-budget of 0.3 GB (below the 497 MB of weights), with the bytes read, the time
# reading and the time the decoder waited. Also this disk's O_DIRECT read rate: with no
# prefetch a token waits for every layer's read; with it, the reading overlaps the compute.
# Usage: bench/zero_inference.sh [MODEL (gpt2-124m)] [BUDGET_GB (0.3)]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="$root/build/meshtrain"
data="$root/data/brown"
model="${1:-gpt2-124m}" budget="${2:-0.3}"
[ -f "$data/train.bin" ] || "$bin" prep --brown --out "$data" >/dev/null
out="$(mktemp -d "${ZERO_INFERENCE_BENCH_DIR:-/tmp}/meshtrain_bench_zinf.XXXXXX")"
trap 'rm -rf "$out"' EXIT
"$bin" train --data "$data" --model "$model" --seq-len 64 --micro-batch 1 --steps 1 --eval-batches 1 --quiet \
  --out "$out/run" >/dev/null
dd if=/dev/zero of="$out/dd" bs=16M count=32 oflag=direct 2>/dev/null
dd if="$out/dd" of=/dev/null bs=16M iflag=direct 2>&1 | awk 'END{print "disk O_DIRECT read: " $(NF-1), $NF}'
rm -f "$out/dd"
echo "$(nproc) cores; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); $model, budget $budget GB"
for i in 1 2 3 4 5 6 7 8; do echo "The jury said that the city number $i"; done > "$out/prompts8.txt"
head -1 "$out/prompts8.txt" > "$out/prompts1.txt"
printf "%7s %-22s %9s %10s %10s  %s\n" prompts weights "tokens/s" "peak MB" "RSS MB" "streaming"
for n in 1 8; do
  for mode in memory "ahead 0" "ahead 1" "ahead 2"; do
    flags=(--memory-budget 4)  # above the weights: in memory, and the memory line printed
    [ "$mode" != memory ] && flags=(--offload weights=nvme --offload-dir "$out" --offload-read-ahead "${mode#ahead }"
                                   --memory-budget "$budget")
    "$bin" generate --checkpoint "$out/run" --prompts "$out/prompts$n.txt" --max-new-tokens 32 --temperature 0 \
      --json --threads 1 --batch 8 "${flags[@]}" >"$out/gen.json" 2>"$out/gen.err"
    python3 - "$n" "$mode" "$out/gen.err" <<'PY'
import re, sys
n, mode, err = sys.argv[1:]
text = open(err).read()  # generate's own line: memory, streaming, and the decoding's time (the load left out)
peak = re.search(r"peak ([0-9.]+) MB tracked", text).group(1)
rss = re.search(r"peak resident set ([0-9.]+) MB", text).group(1)
rate = re.search(r"decoding: .*\(([0-9.]+) tokens/s\)", text).group(1)
streamed = re.search(r"streamed weights: ([^;]*)", text)
print(f"{n:>7} {mode:<22} {rate:>9} {peak:>10} {rss:>10}  {streamed.group(1) if streamed else ''}")
PY
  done
done
