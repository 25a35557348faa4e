#!/usr/bin/env bash
# The main job: set up, build, prepare the Brown corpus, train a small GPT-2 on it
# (configs/demo.toml), then sample from the trained model. Extra arguments are passed to
# `meshtrain train` and override the config (e.g. --steps 50).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/setup.sh"
cd "$root"
[ -f data/brown/train.bin ] || ./build/meshtrain prep --brown --out data/brown
# A second demo starts over in runs/demo (--overwrite), unless asked to --resume it.
fresh=(--overwrite)
for a in "$@"; do [ "$a" = --resume ] && fresh=(); done
./build/meshtrain train --config configs/demo.toml --data data/brown --out runs/demo "${fresh[@]}" "$@"
./build/meshtrain plot runs/demo --out runs/demo/curves.svg
echo "--- sample from runs/demo ---"
./build/meshtrain generate --checkpoint runs/demo --prompt "The jury said" --max-new-tokens 60 --seed 7
