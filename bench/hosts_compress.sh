#!/usr/bin/env bash
# Gradient compression on 2 hosts (scripts/hosts.sh, links shaped to RATE): dp 4 over the two
# hosts (two ranks on each, so every step's reduction crosses the link), a 17.6 M-parameter
# GPT-2 (6 layers, dim 256, the 50257-row embedding) on the Brown corpus, trained with Adam,
# 1-bit Adam (variance frozen after a quarter of the steps) and PowerSGD at rank 1 and 4
# (from step 3). Prints each run's median step time (steps past the compressor's start),
# bytes per step and rank on dp, final loss and the time to reach the target loss (the
# first step whose loss, smoothed as `meshtrain plot` smooths it, is at or below TARGET), and
# writes the loss curves with `meshtrain plot` to OUT.svg.
# With SET=zero3 the runs are ZeRO-3 instead: exact, and with ZeRO++'s int8 weight gathers
# (qwZ) and gradient reduce-scatters (qgZ), each alone and both.
# Usage: [SET=compress|zero3] bench/hosts_compress.sh [RATE (1gbit)] [STEPS (60)]
#        [OUT (plots/SET-RATE)] [TARGET (the smoothed loss the first run ends at, plus 0.05)].
# Needs root.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
set_name="${SET:-compress}"
rate="${1:-1gbit}" steps="${2:-60}" out="${3:-$root/plots/$set_name-$rate}" target="${4:-}"
hosts="$root/scripts/hosts.sh"
name=mtc net=10.231.6
"$hosts" up 2 --rate "$rate" --name $name --net $net >/dev/null
dir="$(mktemp -d)"
trap '"$hosts" down --name $name; rm -rf "$dir"' EXIT
"$hosts" hostfile --name $name >"$dir/hosts.txt"
[ -f "$root/data/brown/train.bin" ] || "$root/build/meshtrain" prep --brown --out "$root/data/brown" >/dev/null
model="--model tiny --layers 6 --dim 256 --heads 4 --seq-len 64 --micro-batch 4 --vocab 50257 --lr 1e-3 --warmup-steps 5"
freeze=$((steps / 4))
echo "rate $rate, $model, dp 4 on ${name}0, ${name}1 (2 slots each), $steps steps"
case "$set_name" in
  compress) specs=("adam|" "onebit-adam|--compress onebit-adam --compress-start $freeze"
                   "powersgd-r1|--compress powersgd --powersgd-rank 1 --compress-start 2"
                   "powersgd-r4|--compress powersgd --powersgd-rank 4 --compress-start 2") ;;
  zero3) specs=("zero3|--zero 3" "zero3-qwz|--zero 3 --zero-quantized-weights"
                "zero3-qgz|--zero 3 --zero-quantized-gradients"
                "zero3-qwz-qgz|--zero 3 --zero-quantized-weights --zero-quantized-gradients") ;;
  *) echo "SET must be compress or zero3, got '$set_name'" >&2; exit 2 ;;
esac
runs=()
for spec in "${specs[@]}"; do
  label="${spec%%|*}" flags="${spec#*|}"
  # shellcheck disable=SC2086
  "$root/build/meshtrain" train --data "$root/data/brown" $model --dp 4 --steps "$steps" --threads 1 --quiet \
    --out "$dir/$label" --hostfile "$dir/hosts.txt" --mpirun-args "$("$hosts" mpirun-args --name $name --net $net)" \
    $flags 2>/dev/null
  runs+=("$dir/$label")
done
mkdir -p "$(dirname "$out")"
"$root/build/meshtrain" plot "${runs[@]}" --out "$out.svg" >/dev/null
python3 - "$target" "$freeze" "${runs[@]}" <<'PY'
import json, os, statistics, sys
target, freeze, dirs = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def load(d):
    return [json.loads(l) for l in open(os.path.join(d, "metrics.jsonl")) if '"loss"' in l]
def smoothed(steps, w=0.9):
    out, s = [], None
    for x in steps:
        s = x["loss"] if s is None else w * s + (1 - w) * x["loss"]
        out.append(s)
    return out
runs = {os.path.basename(d): load(d) for d in dirs}
first_run = os.path.basename(dirs[0])  # the reference: Adam, or exact ZeRO-3
ref = smoothed(runs[first_run])
goal = float(target) if target else ref[-1] + 0.05
print(f"target: smoothed loss <= {goal:.3f} ({first_run} ends at {ref[-1]:.3f})")
print(f"{'run':<13} {'step ms':>9} {'dp MB/step':>11} {'final loss':>11} {'smoothed':>9} {'gap':>7} {'to target s':>12}")
for name, steps in runs.items():
    first = freeze if name == "onebit-adam" else 2
    ms = statistics.median(s["step_ms"] for s in steps[first + 1:])
    mb = statistics.median(s["comm"]["dp"]["bytes"] for s in steps[first + 1:]) / 1e6
    sm = smoothed(steps)
    t, reach = 0.0, None
    for s, v in zip(steps, sm):
        t += s["step_ms"] / 1e3
        if v <= goal and reach is None:
            reach = t
    print(f"{name:<13} {ms:9.1f} {mb:11.3f} {steps[-1]['loss']:11.3f} {sm[-1]:9.3f} {sm[-1] - ref[-1]:7.3f} "
          f"{(f'{reach:.1f}' if reach is not None else 'not reached'):>12}")
PY
echo "plot: $out.svg"
