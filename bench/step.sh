#!/usr/bin/env bash
# End-to-end training-step benchmark, B=8, T=256 on random tokens, on all cores: gpt2-124m
# and llama-124m (GQA, SwiGLU, RoPE, RMSNorm), fp32 and bf16, each beside the measured GEMM
# peak, then the PyTorch peer (tests/reference's models, eager) on the same machine.
# Extra flags go to every `meshtrain bench step` (e.g. --threads 1, or --profile for each run's
# op-by-op table beside the GEMM peak and a STREAM triad, docs/performance.md).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/build/meshtrain" bench peak --precision fp32,bf16
for model in gpt2-124m llama-124m; do
  for precision in fp32 bf16; do
    echo "== meshtrain $model $precision"
    "$root/build/meshtrain" bench step --model "$model" --precision "$precision" --micro-batch 8 --seq-len 256 \
      --steps 3 "$@"
  done
done
# PyTorch's bf16 autocast without bf16 units runs at ~5 GFLOP/s (minutes per step): only
# where the CPU has them, unless MESHTRAIN_BENCH_TORCH_BF16=1.
torch_bf16="${MESHTRAIN_BENCH_TORCH_BF16:-$(grep -qwE 'avx512_bf16|amx_bf16' /proc/cpuinfo && echo 1 || echo 0)}"
for arch in gpt2 llama; do
  /usr/bin/python3 "$root/bench/torch_step.py" --arch "$arch"
  if [ "$torch_bf16" = 1 ]; then /usr/bin/python3 "$root/bench/torch_step.py" --arch "$arch" --bf16 --steps 2
  else echo "torch $arch bf16 autocast: skipped (no bf16 units on this CPU; MESHTRAIN_BENCH_TORCH_BF16=1 runs it)"; fi
done
