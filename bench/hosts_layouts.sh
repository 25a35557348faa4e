#!/usr/bin/env bash
# Layouts of 4 ranks on 2 hosts x 2 slots (scripts/hosts.sh, links shaped to RATE), timed:
# tp inside a host vs across the link, dp vs pp across the link, ZeRO-1 vs ZeRO-3 over dp 4.
# Prints each layout's median step time (steps 3..N of metrics.jsonl), the planner's
# prediction on the cluster file CLUSTER (`meshtrain plan`, the local predictor with the
# file's hosts and links) and their ratio, its bytes per step on each axis, then both
# rankings. Each layout runs REPEATS times and counts with the median of its runs' medians
# (the range beside it): four ranks busy-polling on two cores while the kernel shapes their
# traffic make single runs vary by up to 2x. Usage: bench/hosts_layouts.sh [RATE (1gbit)]
# [STEPS (8)] [CLUSTER (configs/clusters/netns-2x2-1gbit.toml, whose links were measured at
# 1 Gbit/s by bench/hosts_comm.sh)] [REPEATS (3)]. Needs root.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
rate="${1:-1gbit}" steps="${2:-8}" cluster="${3:-$root/configs/clusters/netns-2x2-1gbit.toml}" repeats="${4:-3}"
hosts="$root/scripts/hosts.sh"
name=mtl net=10.231.5
"$hosts" up 2 --rate "$rate" --name $name --net $net >/dev/null
dir="$(mktemp -d)"
trap '"$hosts" down --name $name; rm -rf "$dir"' EXIT
"$hosts" hostfile --name $name >"$dir/hosts.txt"
[ -f "$root/data/brown/train.bin" ] || "$root/build/meshtrain" prep --brown --out "$root/data/brown" >/dev/null
model="--model tiny --layers 4 --dim 128 --heads 4 --seq-len 64 --micro-batch 4 --vocab 50257"
echo "rate $rate, $model, 4 ranks on ${name}0, ${name}1 (2 slots each)"
echo "predicted on $cluster"
printf '%-44s %10s %15s %10s %6s  %s\n' layout step_ms "runs' range" predicted ratio "bytes per step and rank, by axis"
plan_model="--model tiny --layers 4 --dim 128 --heads 4 --seq-len 64 --vocab 50257 --micro-batch 4 --recompute none"
: >"$dir/results"
run() {  # run LABEL "PLAN FLAGS" TRAIN FLAGS...
  local label="$1" plan="$2"; shift 2
  # shellcheck disable=SC2086
  "$root/build/meshtrain" plan --cluster "$cluster" $plan_model $plan --top 1 --json >"$dir/plan.json"
  : >"$dir/medians"
  for ((i = 0; i < repeats; i++)); do
    "$root/build/meshtrain" train --data "$root/data/brown" $model --steps "$steps" --threads 1 --quiet \
      --out "$dir/run" --hostfile "$dir/hosts.txt" --mpirun-args "$("$hosts" mpirun-args --name $name --net $net)" \
      "$@" 2>/dev/null
    python3 - "$dir/run/metrics.jsonl" >>"$dir/medians" <<'PY'
import json, statistics, sys
steps = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
print(statistics.median(s["step_ms"] for s in steps[2:]))
comm = ", ".join(f"{a} {v['bytes']/1e6:.1f} MB" for a, v in steps[-1]["comm"].items() if a != "world")
open(sys.argv[1] + ".comm", "w").write(comm)
PY
    cp "$dir/run/metrics.jsonl.comm" "$dir/comm"
    rm -rf "$dir/run"
  done
  python3 - "$dir/medians" "$label" "$dir/plan.json" "$dir/results" "$dir/comm" <<'PY'
import json, statistics, sys
runs = [float(l) for l in open(sys.argv[1])]
ms = statistics.median(runs)
pred = json.load(open(sys.argv[3]))["layouts"][0]["step_s"] * 1e3
spread = f"{min(runs):.0f}-{max(runs):.0f}"
print(f"{sys.argv[2]:<44} {ms:10.1f} {spread:>15} {pred:10.1f} {pred / ms:6.2f}  {open(sys.argv[5]).read()}")
open(sys.argv[4], "a").write(f"{sys.argv[2]}\t{ms}\t{pred}\t{min(runs)}\t{max(runs)}\n")
PY
}
tpdp="--tp 2 --pp 1 --dp 2 --global-batch 8" ppdp="--tp 1 --pp 2 --dp 2 --global-batch 32 --zero 0 --schedule 1f1b"
run "tp2 dp2, tp inside a host (tp-dp-pp)" "$tpdp --rank-order tp-dp-pp" --tp 2 --dp 2
run "tp2 dp2, tp across the link (dp-tp-pp)" "$tpdp --rank-order dp-tp-pp" --tp 2 --dp 2 --rank-order dp-tp-pp
run "pp2 dp2, dp across the link (pp-dp-tp)" "$ppdp --rank-order pp-dp-tp" --pp 2 --dp 2 --grad-accum 4 --rank-order pp-dp-tp
run "pp2 dp2, pp across the link (dp-pp-tp)" "$ppdp --rank-order dp-pp-tp" --pp 2 --dp 2 --grad-accum 4 --rank-order dp-pp-tp
run "dp4 zero1" "--tp 1 --pp 1 --dp 4 --global-batch 16 --zero 1" --dp 4 --zero 1
run "dp4 zero3" "--tp 1 --pp 1 --dp 4 --global-batch 16 --zero 3" --dp 4 --zero 3
# Each pair's order, measured and predicted (the issue's three comparisons), and both
# rankings of all six.
python3 - "$dir/results" <<'PY'
import sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])]
names = [r[0] for r in rows]; ms = [float(r[1]) for r in rows]; pr = [float(r[2]) for r in rows]
for a, b, what in [(0, 1, "tp inside vs across"), (2, 3, "dp vs pp across"), (4, 5, "ZeRO-1 vs ZeRO-3")]:
    same = (ms[a] < ms[b]) == (pr[a] < pr[b])
    print(f"{what:<22} measured {'first' if ms[a] < ms[b] else 'second'} faster, predicted "
          f"{'first' if pr[a] < pr[b] else 'second'} faster: {'same' if same else 'DIFFERENT'}")
order = lambda v: " < ".join(str(i + 1) for i in sorted(range(len(v)), key=v.__getitem__))
print("ranking by measured step:  ", order(ms))
print("ranking by predicted step: ", order(pr))
print("within 25%:", sum(abs(p / m - 1) <= 0.25 for p, m in zip(pr, ms)), "of", len(ms))
# Every pair of layouts the runs tell apart (their ranges of run medians do not overlap)
# must be ordered as measured; a pair whose ranges overlap is a tie the runs cannot order.
lo = [float(r[3]) for r in rows]; hi = [float(r[4]) for r in rows]
wrong, ties = [], []
for a in range(len(rows)):
    for b in range(a + 1, len(rows)):
        if lo[a] <= hi[b] and lo[b] <= hi[a]:
            ties.append(f"{a + 1}~{b + 1}")
        elif (ms[a] < ms[b]) != (pr[a] < pr[b]):
            wrong.append(f"{a + 1}/{b + 1}")
print("measured ties (runs' ranges overlap):", ", ".join(ties) or "none")
print("pairs the runs order and the planner orders otherwise:", ", ".join(wrong) or "none")
PY
