#!/usr/bin/env bash
# The main job: set up, build, prepare the Brown corpus, train a small GPT-2 on it.
# Extra arguments are passed to `meshtrain train` (e.g. --steps 50).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/setup.sh"
cd "$root"
[ -f data/brown/train.bin ] || ./build/meshtrain prep --brown --out data/brown
./build/meshtrain train --data data/brown --out runs/demo \
  --model small --layers 4 --dim 256 --heads 4 --seq-len 128 --micro-batch 8 \
  --steps 200 --lr 2e-3 --min-lr 2e-4 --warmup-steps 20 --eval-every 50 "$@"
