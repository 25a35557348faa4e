#!/usr/bin/env bash
# meshtrain against llm.c's CPU trainer on the same work: GPT-2 124M, B = 4, T = 64 (the
# sizes train_gpt2.c fixes), the same initial weights (meshtrain's `export --init --format
# llmc`), the same token files (the Brown corpus in llm.c's format), AdamW at lr 1e-4,
# betas 0.9 / 0.999, no weight decay, no clipping, fp32, both on every core.
#
#   bench/llmc.sh LLMC_DIR [STEPS]
#
# LLMC_DIR is an llm.c checkout (https://github.com/karpathy/llm.c); nothing of it is kept
# in this repository. Its train_gpt2.c is built here with llm.c's own flags (-Ofast
# -march=native -fopenmp) into a temporary folder and run there, where it finds
# gpt2_124M.bin and dev/data/tinyshakespeare/tiny_shakespeare_{train,val}.bin: the exported
# weights and Brown's train.bin / val.bin under those names. It is stopped after STEPS
# (default 16, at most 20: its first sampling comes after step 20) timed steps. Prints, for
# both, the median step time over the second half of the steps and tokens/s, the initial validation loss of each (llm.c: 5 batches
# from the start of val.bin; meshtrain's eval on the same batches: the same weights and
# tokens give the same loss), and the GEMM peak measured in the same run.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="$root/build/meshtrain"
llmc="${1:?usage: bench/llmc.sh LLMC_DIR [STEPS]}"
steps="${2:-16}"
[ -f "$llmc/train_gpt2.c" ] || { echo "bench/llmc.sh: no train_gpt2.c in $llmc" >&2; exit 1; }
data="$root/data/brown"
[ -f "$data/train.bin" ] || "$bin" prep --brown --out "$data" >/dev/null
work="$(mktemp -d /tmp/meshtrain_bench_llmc.XXXXXX)"
trap 'kill "${pid:-0}" 2>/dev/null || true; rm -rf "$work"' EXIT
threads="$(nproc)"

# llm.c, built from the given checkout (its headers beside train_gpt2.c).
cc -Ofast -march=native -fopenmp -DOMP -Wno-unused-result -I"$llmc" "$llmc/train_gpt2.c" -lm -o "$work/train_gpt2"
"$bin" export --init --model gpt2-124m --format llmc --out "$work/gpt2_124M.bin" >/dev/null
mv "$work/gpt2_124M_tokenizer.bin" "$work/gpt2_tokenizer.bin" 2>/dev/null || true
mkdir -p "$work/dev/data/tinyshakespeare"
ln -s "$data/train.bin" "$work/dev/data/tinyshakespeare/tiny_shakespeare_train.bin"
ln -s "$data/val.bin" "$work/dev/data/tinyshakespeare/tiny_shakespeare_val.bin"

"$bin" bench peak --precision fp32 --threads "$threads"

# llm.c prints "step k: train loss L (took T ms)" for steps 0..40: read STEPS of them.
cd "$work"
OMP_NUM_THREADS="$threads" ./train_gpt2 > llmc.log 2>&1 &
pid=$!  # train_gpt2's own (a subshell's would leave it running when killed)
cd "$root"
while kill -0 "$pid" 2>/dev/null && [ "$(grep -c '^step ' "$work/llmc.log" 2>/dev/null || true)" -lt "$steps" ]; do
  sleep 1
done
kill "$pid" 2>/dev/null || true
wait "$pid" 2>/dev/null || true

"$bin" train --init-from "$work/gpt2_124M.bin" --data "$data" --micro-batch 4 --seq-len 64 --steps "$steps" \
  --lr 1e-4 --min-lr 1e-4 --warmup-steps 0 --weight-decay 0 --beta1 0.9 --beta2 0.999 --grad-clip 0 \
  --threads "$threads" --eval-batches 1 --quiet --out "$work/meshtrain" >/dev/null
val="$("$bin" eval --checkpoint "$work/gpt2_124M.bin" --data "$data" --batches 5 --micro-batch 4 --seq-len 64 \
  --threads "$threads" | grep -o 'val loss [0-9.]*')"

python3 - "$work" "$steps" "$val" <<'PY'
import json, re, statistics, sys
work, steps, val = sys.argv[1], int(sys.argv[2]), sys.argv[3]
log = open(work + "/llmc.log").read()
llmc_ms = [float(m) for m in re.findall(r"^step \d+: train loss [0-9.]+ \(took ([0-9.]+) ms\)", log, re.M)][:steps]
llmc_val = re.search(r"^val loss ([0-9.]+)", log, re.M)
rows = [json.loads(l) for l in open(work + "/meshtrain/metrics.jsonl") if '"loss"' in l]
mt_ms = [r["step_ms"] for r in rows]
tokens = 4 * 64
half = steps // 2
a, b = statistics.median(llmc_ms[half:]), statistics.median(mt_ms[half:])
print(f"llm.c train_gpt2.c   step {a:8.1f} ms  {tokens / a * 1e3:7.1f} tokens/s  "
      f"initial val loss {llmc_val.group(1) if llmc_val else '?'}")
print(f"meshtrain train      step {b:8.1f} ms  {tokens / b * 1e3:7.1f} tokens/s  initial {val}")
print(f"meshtrain / llm.c: {a / b:.2f}x (medians of steps {half + 1}..{steps}, B=4 T=64, fp32, the same cores)")
print("all steps, ms: llm.c", [round(x) for x in llmc_ms], "meshtrain", [round(x) for x in mt_ms])
PY
