#!/usr/bin/env bash
# Mixture of Experts on this machine: a 6-layer, 384-wide Llama-parts model (T=256, 8 rows
# per step) whose every MLP is 8 experts of 512, top-2, against the dense model with the
# same active parameters (one MLP of 1024 = 2 x 512), trained on the Brown corpus:
#   one process x 2 threads: dense, MoE      |   2 ranks x 1 thread: dense dp 2, MoE dp 2 ep 2
# Prints tokens/s (medians over the timed steps), the ratio MoE / dense, the MoE runs'
# tokens-per-expert CV, and for ep 2 the all-to-all's time: its share of the step and the
# share of it hidden behind compute (the shared expert's, in the last run). The machine's
# GEMM peak is printed first.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="$root/build/meshtrain"
data="$root/data/brown"
[ -f "$data/train.bin" ] || "$bin" prep --brown --out "$data" >/dev/null
out="$(mktemp -d /tmp/meshtrain_bench_moe.XXXXXX)"
trap 'rm -rf "$out"' EXIT
shape=(--model llama-tiny --layers 6 --dim 384 --heads 6 --kv-heads 2 --seq-len 256 --steps 12
       --eval-batches 1 --data "$data" --quiet)
dense=(--ffn-dim 1024)
moe=(--ffn-dim 1024 --moe-experts 8 --moe-top-k 2 --moe-ffn-dim 512)
summary() {  # name, run dir, dense tokens/s (or 0): medians of steps 3.. (the first warm up)
  python3 - "$1" "$2" "$3" <<'PY'
import json, statistics, sys
name, d, dense = sys.argv[1], sys.argv[2], float(sys.argv[3])
rows = [json.loads(l) for l in open(d + "/metrics.jsonl") if '"loss"' in l][2:]
med = lambda f: statistics.median(f(r) for r in rows)
tok = med(lambda r: r["tokens_per_s"])
line = f"{name:26s} {tok:8.0f} tok/s  step {med(lambda r: r['step_ms']):7.1f} ms"
if dense > 0: line += f"  {tok / dense:5.2f}x dense"
if "moe" in rows[0]: line += f"  experts cv {med(lambda r: r['moe']['tokens_per_expert']['cv']):.2f}"
ep = [r["comm_time"].get("ep") for r in rows]
if ep[0]:
    wait = med(lambda r: r["comm_time"]["ep"]["wait_ms"]); busy = med(lambda r: r["comm_time"]["ep"]["busy_ms"])
    share = wait / med(lambda r: r["step_ms"])
    line += f"  all-to-all {wait:6.1f} ms ({100 * share:4.1f}% of the step), hidden {100 * max(0.0, 1 - wait / busy) if busy else 0:4.1f}%"
print(line)
print(f"{tok:.1f}", file=open(d + "/tok", "w"))
PY
}
"$bin" bench peak
"$bin" train "${shape[@]}" "${dense[@]}" --micro-batch 8 --threads 2 --out "$out/dense1"
summary "dense, 1 x 2 threads" "$out/dense1" 0
"$bin" train "${shape[@]}" "${moe[@]}" --micro-batch 8 --threads 2 --out "$out/moe1"
summary "MoE 8x top-2, 1 x 2 threads" "$out/moe1" "$(cat "$out/dense1/tok")"
"$bin" train "${shape[@]}" "${dense[@]}" --micro-batch 4 --dp 2 --out "$out/dense2" 2>/dev/null
summary "dense, dp 2" "$out/dense2" 0
"$bin" train "${shape[@]}" "${moe[@]}" --micro-batch 4 --dp 2 --ep 2 --out "$out/moe2" 2>/dev/null
summary "MoE 8x top-2, dp 2 ep 2" "$out/moe2" "$(cat "$out/dense2/tok")"
# DeepSeek's shape adds a shared expert, which runs while the dispatch is in flight.
"$bin" train "${shape[@]}" "${moe[@]}" --moe-shared-experts 1 --micro-batch 4 --dp 2 --ep 2 --out "$out/shared2" 2>/dev/null
summary "MoE + 1 shared, dp 2 ep 2" "$out/shared2" 0
