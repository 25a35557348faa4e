#!/usr/bin/env bash
# Layouts of 4 ranks on 2 hosts x 2 slots (scripts/hosts.sh, links shaped to RATE), timed:
# tp inside a host vs across the link, dp vs pp across the link, ZeRO-1 vs ZeRO-3 over dp 4.
# Prints each layout's median step time (steps 3..N of metrics.jsonl) and its bytes per
# step on each axis. Usage: bench/hosts_layouts.sh [RATE (1gbit)] [STEPS (8)]. Needs root.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
rate="${1:-1gbit}" steps="${2:-8}"
hosts="$root/scripts/hosts.sh"
name=mtl net=10.231.5
"$hosts" up 2 --rate "$rate" --name $name --net $net >/dev/null
dir="$(mktemp -d)"
trap '"$hosts" down --name $name; rm -rf "$dir"' EXIT
"$hosts" hostfile --name $name >"$dir/hosts.txt"
[ -f "$root/data/brown/train.bin" ] || "$root/build/meshtrain" prep --brown --out "$root/data/brown" >/dev/null
model="--model tiny --layers 4 --dim 128 --heads 4 --seq-len 64 --micro-batch 4 --vocab 50257"
echo "rate $rate, $model, 4 ranks on ${name}0, ${name}1 (2 slots each)"
printf '%-44s %10s  %s\n' layout step_ms "bytes per step and rank, by axis"
run() {  # run LABEL FLAGS...
  local label="$1"; shift
  "$root/build/meshtrain" train --data "$root/data/brown" $model --steps "$steps" --threads 1 --quiet \
    --out "$dir/run" --hostfile "$dir/hosts.txt" --mpirun-args "$("$hosts" mpirun-args --name $name --net $net)" \
    "$@" 2>/dev/null
  python3 - "$dir/run/metrics.jsonl" "$label" <<'PY'
import json, statistics, sys
steps = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
ms = statistics.median(s["step_ms"] for s in steps[2:])
comm = ", ".join(f"{a} {v['bytes']/1e6:.1f} MB" for a, v in steps[-1]["comm"].items() if a != "world")
print(f"{sys.argv[2]:<44} {ms:10.1f}  {comm}")
PY
  rm -rf "$dir/run"
}
run "tp2 dp2, tp inside a host (tp-dp-pp)" --tp 2 --dp 2
run "tp2 dp2, tp across the link (dp-tp-pp)" --tp 2 --dp 2 --rank-order dp-tp-pp
run "pp2 dp2, dp across the link (pp-dp-tp)" --pp 2 --dp 2 --grad-accum 4 --rank-order pp-dp-tp
run "pp2 dp2, pp across the link (dp-pp-tp)" --pp 2 --dp 2 --grad-accum 4 --rank-order dp-pp-tp
run "dp4 zero1" --dp 4 --zero 1
run "dp4 zero3" --dp 4 --zero 3
