#!/usr/bin/env bash
# Data-parallel benchmark on this machine: a 6-layer, 384-wide GPT-2 (T=256, 4 rows per
# rank per step) trained on the Brown corpus as
#   one process x 2 threads (B=8)   |   dp=2 x 1 thread, overlapped   |   dp=2, --no-overlap
# for each ZeRO stage given (default 0). Prints tokens/s, step time, communication time
# and the fraction of communication hidden behind compute (medians over the timed steps).
# Then the PyTorch peer on the same model and rows, the same minutes (bench/torch_step.py:
# one process x all cores, and DistributedDataParallel over gloo, 2 processes x 1 thread).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="$root/build/meshtrain"
data="$root/data/brown"
[ -f "$data/train.bin" ] || "$bin" prep --brown --out "$data" >/dev/null
stages="${*:-0}"
out="$(mktemp -d /tmp/meshtrain_bench_dp.XXXXXX)"
trap 'rm -rf "$out"' EXIT
model=(--model small --layers 6 --dim 384 --heads 6 --seq-len 256 --steps 12 --eval-batches 1
       --data "$data" --quiet)
summary() {  # name, run dir: medians of steps 3.. (the first steps warm up)
  python3 - "$1" "$2" <<'PY'
import json, statistics, sys
name, d = sys.argv[1], sys.argv[2]
rows = [json.loads(l) for l in open(d + "/metrics.jsonl") if '"loss"' in l][2:]
med = lambda k: statistics.median(r.get(k, 0) for r in rows)
print(f"{name:28s} {med('tokens_per_s'):8.0f} tok/s  step {med('step_ms'):7.1f} ms  "
      f"comm wait {med('comm_ms'):6.1f} ms  comm busy {med('comm_busy_ms'):6.1f} ms  "
      f"hidden {100 * med('comm_hidden'):5.1f}%")
PY
}
"$bin" bench peak
"$bin" train "${model[@]}" --micro-batch 8 --threads 2 --out "$out/single"
summary "1 process x 2 threads" "$out/single"
for z in $stages; do
  "$bin" train "${model[@]}" --micro-batch 4 --dp 2 --zero "$z" --out "$out/dp$z" 2>/dev/null
  summary "dp=2 zero=$z overlap" "$out/dp$z"
  "$bin" train "${model[@]}" --micro-batch 4 --dp 2 --zero "$z" --no-overlap --out "$out/dp${z}n" 2>/dev/null
  summary "dp=2 zero=$z no overlap" "$out/dp${z}n"
done
# The peer: tests/reference's GPT-2 in eager PyTorch, random tokens (the time does not
# depend on their values), 10 timed steps after 2.
peer=(/usr/bin/python3 "$root/bench/torch_step.py" --arch gpt2 --layers 6 --dim 384 --heads 6 --seq-len 256
      --batch 8 --steps 10 --warmup 2)
"${peer[@]}"
"${peer[@]}" --ddp 2
