#!/usr/bin/env bash
# End-to-end training-step benchmark: gpt2-124m, B=8, T=256, fp32, on all cores.
# Prints tokens/s and MFU beside the measured fp32 GEMM peak. Extra flags go to
# `meshtrain bench step` (e.g. --threads 1, --model gpt2-350m).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/build/meshtrain" bench peak
"$root/build/meshtrain" bench step --model gpt2-124m --micro-batch 8 --seq-len 256 --steps 3 "$@"
