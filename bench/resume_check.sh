#!/usr/bin/env bash
# What --resume's integrity check costs: a MODEL run (gpt2-124m by default: 1.5 GB of
# parameters and Adam moments) saved after one step, then resumed for one more. The resume
# line says how many bytes of checksums were checked and in how long; beside it, the same
# shard files read with dd from the page cache and with O_DIRECT (the machine's read rates,
# in the same run), and the resume's whole setup time.
# Usage: bench/resume_check.sh [MODEL (gpt2-124m)] [RANKS (1)]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="$root/build/meshtrain"
model="${1:-gpt2-124m}" ranks="${2:-1}"
dir="$(mktemp -d "$root/build/resume_check.XXXXXX")"  # on the build's disk, not tmpfs
trap 'rm -rf "$dir"' EXIT
[ -f "$root/data/brown/train.bin" ] || "$bin" prep --brown --out "$root/data/brown" >/dev/null
echo "$(nproc) cores; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); $model, $ranks rank(s)"
flags=(--data "$root/data/brown" --model "$model" --seq-len 64 --micro-batch 1 --dp "$ranks" --out "$dir/run")
"$bin" train "${flags[@]}" --steps 1 --quiet >/dev/null
ckpt="$(ls -d "$dir"/run/checkpoints/step_* | tail -1)"
bytes="$(cat "$ckpt"/shard_*.bin | wc -c)"
read_rate() {  # MB/s of dd reading every shard file with the given flag
  local start end
  start=$(date +%s.%N)
  for f in "$ckpt"/shard_*.bin; do dd if="$f" of=/dev/null bs=4M $1 status=none; done
  end=$(date +%s.%N)
  python3 -c "print(f'{$bytes / 1e6 / ($end - $start):.0f}')"
}
cached="$(read_rate '')"
direct="$(read_rate iflag=direct 2>/dev/null || echo n/a)"
start=$(date +%s.%N)
"$bin" train "${flags[@]}" --steps 2 --resume >"$dir/resumed.out" 2>&1
line="$(grep -m1 'resumed at step' "$dir/resumed.out")"
end=$(date +%s.%N)
echo "$line" | grep -oE 'its [0-9.]+ GB checked \(checksums\) in [0-9.]+ s'
checked_s="$(echo "$line" | grep -oE 'in [0-9.]+ s' | head -1 | grep -oE '[0-9.]+')"
python3 - "$bytes" "$checked_s" "$cached" "$direct" "$start" "$end" <<'PY'
import sys
size, checked, cached, direct, start, end = sys.argv[1:]
size, checked = int(size), float(checked)
print(f"checkpoint {size / 1e9:.2f} GB: checked at {size / 1e6 / checked:.0f} MB/s; "
      f"dd reads it at {cached} MB/s (page cache), {direct} MB/s (O_DIRECT); "
      f"the whole resumed run (setup, load, 1 step) {float(end) - float(start):.1f} s")
PY
