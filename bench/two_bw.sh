#!/usr/bin/env bash
# PipeDream-2BW (--schedule 2bw) against the flushing schedules on 2 pipeline ranks.
#  1. Throughput: an 8-layer, width-128 model on 2 stages of 4 layers with a 256-token
#     vocabulary (so the head is small and the stages cost nearly the same; the Brown
#     corpus's tokens folded into 256 ids), B = 8 rows of 64 tokens per micro-batch, m = 4
#     and 8: each schedule REPEATS runs of 10 steps, the median of their median steps 3-10
#     (step ms, tokens/s, the measured bubble and the simulator's own share of it at the
#     measured costs), rank 0's tracked parameter memory (2bw's second weight version), and
#     the MFU beside the machine's fp32 GEMM peak per rank that the run measured.
#  2. Convergence on the Brown corpus (GPT-2's vocabulary): a 4-layer, width-128 model, pp 2,
#     1f1b against 2bw for STEPS steps of 16 rows x 64 tokens (m = 4), the same seed; the
#     loss curves plotted by `meshtrain plot` into OUT (default: a temporary folder), the
#     last 20 steps' mean loss and the final val loss of each printed.
# Usage: bench/two_bw.sh [REPEATS (3)] [STEPS (300); 0 skips part 2] [OUT]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="$root/build/meshtrain"
repeats="${1:-3}" steps="${2:-300}"
data="$root/data/brown"
[ -f "$data/train.bin" ] || "$bin" prep --brown --out "$data" >/dev/null
dir="$(mktemp -d /tmp/meshtrain_bench_2bw.XXXXXX)"
trap 'rm -rf "$dir"' EXIT
out="${3:-$dir/plots}"
mkdir -p "$out" "$dir/small"
# llm.c's token files: a 256-int32 header (magic 20240520, version 1, count), uint16 tokens.
python3 - "$data" "$dir/small" <<'PY'
import struct, sys
src, dst = sys.argv[1:]
for name in ("train.bin", "val.bin"):
    raw = open(f"{src}/{name}", "rb").read()
    header, body = raw[:1024], raw[1024:]
    tokens = struct.unpack(f"<{len(body) // 2}H", body)
    folded = bytes(b for t in tokens for b in struct.pack("<H", t % 256))
    open(f"{dst}/{name}", "wb").write(header + folded)
PY
echo "$(nproc) cores; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
printf '%-8s %3s %10s %12s %10s %16s %12s %14s %7s %16s\n' schedule m step_ms "runs' range" tokens/s "bubble (median)" "sched. share" "params MB r0" MFU "peak GFLOP/s"
small="--data $dir/small --vocab 256 --dim 128 --heads 4 --layers 8 --seq-len 64 --micro-batch 8 --pp 2 --stage-layers 4,4"
for m in 4 8; do
  for schedule in gpipe 1f1b 2bw; do
    : >"$dir/runs"
    for ((i = 0; i < repeats; i++)); do
      # shellcheck disable=SC2086
      "$bin" train $small --schedule $schedule --grad-accum $m --steps 10 --threads 1 --quiet --eval-batches 1 \
        --out "$dir/run" >/dev/null 2>&1
      python3 - "$dir/run/metrics.jsonl" >>"$dir/runs" <<'PY'
import json, statistics, sys
s = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l][2:]
med = lambda f: statistics.median(f(x) for x in s)
print(med(lambda x: x["step_ms"]), med(lambda x: x["tokens_per_s"]), med(lambda x: x["bubble"]),
      med(lambda x: x["bubble_parts"]["schedule"]), s[-1]["mem"]["params"] / 1e6, med(lambda x: x["mfu"]),
      s[-1]["peak_gflops"])
PY
      rm -rf "$dir/run"
    done
    python3 - "$dir/runs" "$schedule" "$m" <<'PY'
import statistics, sys
rows = [list(map(float, l.split())) for l in open(sys.argv[1])]
col = lambda i: statistics.median(r[i] for r in rows)
lo, hi = min(r[0] for r in rows), max(r[0] for r in rows)
print(f"{sys.argv[2]:<8} {sys.argv[3]:>3} {col(0):10.1f} {f'{lo:.0f}-{hi:.0f}':>12} {col(1):10.0f} {col(2):16.3f} {col(3):12.3f} {col(4):14.2f} {100 * col(5):6.1f}% {col(6):16.1f}")
PY
  done
done
[ "$steps" -gt 0 ] || exit 0
echo
echo "convergence: Brown, 4 layers x 128, pp 2, m = 4 x 4 rows x 64 tokens, $steps steps"
brown="--data $data --model tiny --layers 4 --dim 128 --heads 4 --seq-len 64 --vocab 50257 --micro-batch 4 --grad-accum 4 --pp 2"
for schedule in 1f1b 2bw; do
  # shellcheck disable=SC2086
  "$bin" train $brown --schedule $schedule --steps "$steps" --threads 1 --quiet --eval-every 50 --eval-batches 8 \
    --out "$out/$schedule" >/dev/null 2>&1
  python3 - "$out/$schedule/metrics.jsonl" "$schedule" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
steps = [r for r in rows if "loss" in r]
evals = [r for r in rows if "val_loss" in r]
print(f"{sys.argv[2]:<6} mean loss of the last 20 steps {statistics.mean(r['loss'] for r in steps[-20:]):.4f}, "
      f"val loss {evals[-1]['val_loss']:.4f} at step {evals[-1]['step']}, median step {statistics.median(r['step_ms'] for r in steps[2:]):.1f} ms")
PY
done
"$bin" plot "$out/1f1b" "$out/2bw" --out "$out/2bw-vs-1f1b.svg" >/dev/null
echo "plot: $out/2bw-vs-1f1b.svg"
