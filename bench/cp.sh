#!/usr/bin/env bash
# Context parallelism (docs/long_context.md): step time, memory and wire bytes at cp 1, 2, 4
# and 8 against one rank at the same T, for the ring, Ulysses (a2a) and all-gather; the share of the
# ring's communication hidden behind attention (1 - the cp axis's wait over its busy time,
# as metrics.jsonl's comm_time records them); the T at which a2a and ring cross over; and
# the peak memory per rank at T = 32K (and 131K with BIG=1, several minutes a step).
# The model is Llama-tiny's shape (4 heads over 2 key/value heads, C = 64, 2 layers) over a
# 256-token vocabulary (the Brown corpus's GPT-2 tokens folded mod 256), so that attention,
# which cp splits, is most of the work. Medians of steps 2.. (the first warms up). Each run
# prints its MFU against the GEMM peak it measured in the same run (peak_gflops).
# On a 2-core machine cp = 4 and 8 run 4 and 8 ranks on 2 cores: their times mix the split
# with oversubscription; their memory and bytes are exact regardless.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="$root/build/meshtrain"
brown="$root/data/brown"
[ -f "$brown/train.bin" ] || "$bin" prep --brown --out "$brown" >/dev/null
out="$(mktemp -d /tmp/meshtrain_bench_cp.XXXXXX)"
trap 'rm -rf "$out"' EXIT
python3 "$root/bench/brown_mod256.py" "$brown" "$out/data"
steps="${STEPS:-4}"
model=(--model llama-tiny --vocab 256 --micro-batch 1 --data "$out/data" --eval-batches 1 --quiet)
summary() {
  python3 - "$@" <<'PY'
import json, statistics, sys
name, d = sys.argv[1], sys.argv[2]
rows = [json.loads(l) for l in open(d + "/metrics.jsonl") if '"loss"' in l]
rows = rows[1:] or rows
med = lambda f: statistics.median(f(r) for r in rows)
cp = rows[-1]["comm"].get("cp", {"bytes": 0})
t = rows[-1].get("comm_time", {}).get("cp")
# The hidden share means something for the ring only: a2a's all-to-alls block.
hidden = f"{100 * med(lambda r: 1 - r['comm_time']['cp']['wait_ms'] / r['comm_time']['cp']['busy_ms']):5.1f}%" \
    if t and "ring" in name else "    -"
peak_mib = max(r["mem"]["total"] for r in rows) / 2**20
print(f"{name:30s} step {med(lambda r: r['step_ms']):8.0f} ms  {med(lambda r: r['tokens_per_s']):8.0f} tok/s  "
      f"MFU {100 * med(lambda r: r['mfu']):5.1f}% of {rows[-1]['peak_gflops']:.0f} GFLOP/s  "
      f"peak {peak_mib:8.1f} MiB/rank  cp {cp['bytes'] / 2**20:7.2f} MiB/step  hidden {hidden}")
PY
}
run() {  # name, flags...
  local name="$1"; shift
  "$bin" train "${model[@]}" "$@" --out "$out/r" >/dev/null 2>&1 || { echo "$name: failed"; rm -rf "$out/r"; return; }
  summary "$name" "$out/r"
  rm -rf "$out/r"
}
echo "== cp 1, 2, 4 at T = 4096 (ring, a2a and all-gather), against one rank =="
run "T=4096 cp=1" --seq-len 4096 --steps "$steps" --threads 2
for cp in 2 4 8; do
  for comm in ring a2a all-gather; do
    # (Ulysses cannot split llama-tiny's 4 query heads over 8 ranks.)
    [ "$cp" = 8 ] && [ "$comm" = a2a ] && continue
    run "T=4096 cp=$cp $comm" --seq-len 4096 --cp "$cp" --cp-comm "$comm" --steps "$steps" --threads 1
  done
done
echo "== ring against a2a and all-gather at cp 2 over T (the crossover) =="
for T in 256 1024 4096 16384; do
  for comm in ring a2a all-gather; do
    run "T=$T cp=2 $comm" --seq-len "$T" --cp 2 --cp-comm "$comm" --steps "$steps" --threads 1
  done
done
echo "== peak memory per rank at long T =="
run "T=32768 cp=1" --seq-len 32768 --steps 2 --threads 2
run "T=32768 cp=2 ring" --seq-len 32768 --cp 2 --steps 2 --threads 1
run "T=32768 cp=4 ring" --seq-len 32768 --cp 4 --steps 2 --threads 1
if [ "${BIG:-0}" = 1 ]; then
  run "T=131072 cp=1" --seq-len 131072 --steps 1 --threads 2
  run "T=131072 cp=4 ring" --seq-len 131072 --cp 4 --steps 1 --threads 1
fi
