#!/usr/bin/env bash
# gpt2-124m at T=1024 (B=2, 2048 tokens per step) on the Brown corpus: activation bytes
# per layer (measured) and step time for --recompute none / selective / full on one
# process with 2 threads, then tp=2 on two ranks (1 thread each) against that one rank.
# Medians of the timed steps (the first step warms up).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="$root/build/meshtrain"
data="$root/data/brown"
[ -f "$data/train.bin" ] || "$bin" prep --brown --out "$data" >/dev/null
out="$(mktemp -d /tmp/meshtrain_bench_tp.XXXXXX)"
trap 'rm -rf "$out"' EXIT
steps="${STEPS:-4}"
common=(--model gpt2-124m --seq-len 1024 --micro-batch 2 --steps "$steps" --eval-batches 1
        --data "$data" --quiet)
summary() {
  python3 - "$1" "$2" <<'PY'
import json, statistics, sys
name, d = sys.argv[1], sys.argv[2]
rows = [json.loads(l) for l in open(d + "/metrics.jsonl") if '"loss"' in l][1:]
med = lambda k: statistics.median(r[k] for r in rows)
print(f"{name:34s} step {med('step_ms'):8.0f} ms  {med('tokens_per_s'):6.0f} tok/s  "
      f"activations peak {rows[-1]['mem']['activations'] / 2**20:7.0f} MiB  "
      f"recomputed {100 * med('recompute_fraction'):5.1f}% of a forward")
PY
}
"$bin" bench activations --model gpt2-124m --seq-len 1024 --micro-batch 2 --tp 2
for mode in none selective full; do
  "$bin" train "${common[@]}" --threads 2 --recompute "$mode" --out "$out/$mode"
  summary "1 rank x 2 threads, recompute $mode" "$out/$mode"
done
"$bin" train "${common[@]}" --tp 2 --out "$out/tp2" 2>/dev/null
summary "tp=2 x 1 thread, recompute none" "$out/tp2"
"$bin" train "${common[@]}" --tp 2 --sp --out "$out/tp2sp" 2>/dev/null
summary "tp=2 + sp x 1 thread" "$out/tp2sp"
