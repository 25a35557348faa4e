#!/usr/bin/env bash
# ZeRO-Infinity's headline run on this machine: a GPT whose model states do not fit in its
# memory, trained for a few steps on 2 ranks (1 thread each) with every state in files.
#   24 layers x 2560 wide, 20 heads, GPT-2 vocabulary: 2.02B parameters, whose fp32
#   parameters, gradients and AdamW moments (16 bytes per parameter) are 32.3 GB, more than
#   this machine's 24 GiB (25.8 GB) of RAM. T=128, one row per rank per step.
# --zero 3 --offload params=nvme,grads=nvme,optimizer=nvme: each rank's shard of all four
# arrays lives in files under OFFLOAD_DIR (16.2 GB a rank); a unit's parameter shard is read
# ahead of use and all-gathered, its reduced gradient shard written as it retires, and the
# update streams the four arrays chunk by chunk. The run ends with a checkpoint written shard
# by shard from the files (12 bytes per parameter: params, m, v).
# Prints per step: loss, step time, the tracker's peak and the peak RSS of rank 0, and the
# I/O split (read, written, hidden, exposed) of the per-unit traffic and of the update;
# and the machine's memory in use (total - available), sampled every 2 s, at its highest.
# Needs ~60 GB free under OFFLOAD_DIR (default /tmp): 32.3 GB of state, 24.2 GB of checkpoint.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="$root/build/meshtrain"
data="$root/data/brown"
[ -f "$data/train.bin" ] || "$bin" prep --brown --out "$data" >/dev/null
out="$(mktemp -d "${OFFLOAD_DIR:-/tmp}/meshtrain_infinity.XXXXXX")"
trap 'kill $sampler 2>/dev/null || true; rm -rf "$out"' EXIT
( while true; do awk '/MemTotal/{t=$2} /MemAvailable/{a=$2} END{print (t-a)*1024}' /proc/meminfo; sleep 2; done ) \
  > "$out/used.txt" &
sampler=$!
start=$(date +%s)
"$bin" train --model gpt2-350m --layers 24 --dim 2560 --heads 20 --seq-len 128 --micro-batch 1 \
  --dp 2 --threads 1 --zero 3 --steps ${STEPS:-3} --eval-batches 1 --lr 1e-4 --warmup-steps 0 \
  --offload params=nvme,grads=nvme,optimizer=nvme --offload-dir "$out/files" --offload-chunk-mb 64 \
  --data "$data" --out "$out/run"
end=$(date +%s)
kill $sampler 2>/dev/null || true
python3 - "$out" "$((end - start))" <<'PY'
import json, sys
d, wall = sys.argv[1], int(sys.argv[2])
rows = [json.loads(l) for l in open(d + "/run/metrics.jsonl") if '"loss"' in l]
used = max(float(x) for x in open(d + "/used.txt") if x.strip())
print(f"wall {wall} s, setup and the final checkpoint included")
for r in rows:
    o = r["offload"]
    print(f"step {r['step']}: loss {r['loss']:.4f}  step {r['step_ms'] / 1e3:7.1f} s  "
          f"tracked peak {r['mem']['total'] / 1e9:5.2f} GB  peak RSS {r['peak_rss'] / 1e9:5.2f} GB")
    for part in ("units", "update"):
        p = o[part]
        print(f"   {part:7s} read {p['read_bytes'] / 1e9:6.2f} GB  written {p['written_bytes'] / 1e9:6.2f} GB  "
              f"io {p['io_ms'] / 1e3:6.1f} s  hidden {p['hidden_ms'] / 1e3:6.1f} s  exposed {p['wait_ms'] / 1e3:6.1f} s")
print(f"machine memory in use at most: {used / 1e9:.2f} GB of {open('/proc/meminfo').readline().split()[1]} kB")
PY
