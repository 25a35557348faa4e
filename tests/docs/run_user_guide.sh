#!/usr/bin/env bash
# Runs every ```sh block of docs/user-guide.md, in order, in a scratch folder, with the
# built meshtrain on PATH. Usage: run_user_guide.sh MESHTRAIN_BINARY
set -euo pipefail
binary="$(realpath "$1")"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
work="$(mktemp -d /tmp/meshtrain_guide.XXXXXX)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/bin"
ln -s "$binary" "$work/bin/meshtrain"
ln -s "$root/configs" "$work/configs"
# The tokenizers setup builds (data/tokenizers/), where the guide names them from the source tree.
mkdir -p "$work/data"
ln -s "$root/data/tokenizers" "$work/data/tokenizers"
# Extract the sh blocks into one script; every command must succeed.
awk '/^```sh$/ {on=1; next} /^```/ {on=0} on' "$root/docs/user-guide.md" >"$work/guide.sh"
[ -s "$work/guide.sh" ] || { echo "no sh blocks found in docs/user-guide.md"; exit 1; }
cd "$work"
export PATH="$work/bin:$PATH"
export MESHTRAIN_CACHE_DIR="$work/cache"
# A cache of its own: the first run measures this machine's peak (machine/peak.h), as a new
# user's would.
mkdir -p cache
bash -euo pipefail -x guide.sh
# The guide's promises, checked on what it produced.
test -f runs/tiny/metrics.jsonl && test -f runs/tiny/config.toml
test -f plots/compare.svg
test -f plots/timeline.svg && test "$(grep -c '"bubble"' runs/pp/metrics.jsonl)" -eq 5
test "$(grep -c '"loss"' runs/long/metrics.jsonl)" -eq 40
test "$(grep -c '"data_mix"' runs/mix/metrics.jsonl)" -eq 10
grep -q '"vocab": 128256' runs/llama3/config.json
# MESHTRAIN_GUIDE_RECORD=FILE (scripts/record_losses.sh): every run's losses and grad norms
# as written, to compare two builds bit for bit.
if [ -n "${MESHTRAIN_GUIDE_RECORD:-}" ]; then
  for m in $(find . -name metrics.jsonl | sort); do
    echo "run $m"
    python3 -c 'import json,sys
for line in open(sys.argv[1]):
    j = json.loads(line)
    print(" ".join("%s=%s" % (k, json.dumps(j[k])) for k in ("step", "loss", "grad_norm", "val_loss", "loss_scale") if k in j))' "$m"
  done >"$MESHTRAIN_GUIDE_RECORD"
fi
echo "user guide: all commands ran"
