#!/usr/bin/env bash
# Pipeline bubble and step time: pp = 2 and 4, m in {4, 8, 16} micro-batches, GPipe, 1F1B
# and interleaved 1F1B (v = 2). For the bubble to be the schedule's own, stages must cost
# the same: the model is 8 layers of width 256 over a 256-token vocabulary (the Brown
# corpus's GPT-2 tokens folded mod 256), so the head is small next to a stage, and the
# stages get equal layer counts. Medians of steps 2.. (the first step warms up).
# pp = 4 runs 4 ranks on this 2-core machine: ranks share cores, so its times mix the
# bubble with oversubscription (stated next to the figures in bench/README.md).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="$root/build/meshtrain"
brown="$root/data/brown"
[ -f "$brown/train.bin" ] || "$bin" prep --brown --out "$brown" >/dev/null
out="$(mktemp -d /tmp/meshtrain_bench_pp.XXXXXX)"
trap 'rm -rf "$out"' EXIT
python3 "$root/bench/brown_mod256.py" "$brown" "$out/data"
steps="${STEPS:-5}"
common=(--vocab 256 --dim 256 --heads 4 --layers 8 --seq-len 128 --micro-batch 2
        --steps "$steps" --eval-batches 1 --data "$out/data" --threads 1 --quiet)
summary() {
  python3 - "$@" <<'PY'
import json, statistics, sys
name, d = sys.argv[1], sys.argv[2]
rows = [json.loads(l) for l in open(d + "/metrics.jsonl") if '"loss"' in l][1:]
med = lambda k: statistics.median(r[k] for r in rows)
print(f"{name:28s} step {med('step_ms'):7.0f} ms   bubble measured {med('bubble'):.3f}   "
      f"theory {rows[-1]['bubble_theory']:.3f}   peak sets on rank 0 {rows[-1]['pp_peak_sets']}")
PY
}
for pp in 2 4; do
  for m in 4 8 16; do
    split=$(python3 -c "print(','.join(['$((8 / pp))'] * $pp))")
    split2=$(python3 -c "print(','.join(['$((8 / pp / 2))'] * $((2 * pp))))")
    for sched in gpipe 1f1b interleaved; do
      flags=(--pp "$pp" --grad-accum "$m" --schedule "$sched" --stage-layers "$split")
      [ "$sched" = interleaved ] && flags=(--pp "$pp" --grad-accum "$m" --schedule interleaved
                                           --virtual-stages 2 --stage-layers "$split2")
      "$bin" train "${common[@]}" "${flags[@]}" --out "$out/r" 2>/dev/null
      summary "pp=$pp m=$m $sched" "$out/r"
      rm -rf "$out/r"
    done
  done
done
