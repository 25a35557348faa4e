#!/usr/bin/env bash
# ZeRO-Infinity benchmark on this machine: fp32 ZeRO-3 with the parameter and gradient
# shards in files (--offload params=nvme,grads=nvme), against the same run in memory, on
# a model that fits: 12 layers x 768 wide (gpt2-124m), T=256, B=4, one process x 2 threads.
# Per block and micro-batch the forward computes ~2 x 7.1M x 1024 = 14.5 GFLOP while it
# reads a 28 MB shard: compute per unit well above the I/O per unit at this disk's speed.
# Prints, medians over the timed steps: step time in memory and from files, and for the
# per-unit traffic (parameter reads and gradient writes during forward and backward) and
# the update's streaming: bytes, I/O time, time waited (exposed) and the fraction hidden.
# Goal: >= 80% of the per-unit I/O hidden. Also prints this disk's O_DIRECT bandwidth.
# PRECISION=bf16 (or fp16) runs the same with 16-bit storage: the shards in the files are
# then bf16 words (2 bytes per element), beside fp32 master weights and moments.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="$root/build/meshtrain"
data="$root/data/brown"
[ -f "$data/train.bin" ] || "$bin" prep --brown --out "$data" >/dev/null
out="$(mktemp -d "${OFFLOAD_BENCH_DIR:-/tmp}/meshtrain_bench_offload.XXXXXX")"
trap 'rm -rf "$out"' EXIT
model=(--model gpt2-124m --seq-len 256 --micro-batch 4 --steps ${STEPS:-6} --eval-batches 1 --threads 2
       --zero 3 --precision "${PRECISION:-fp32}" --data "$data" --quiet)
disk() {  # O_DIRECT write then read of 1 GiB in the offload folder
  dd if=/dev/zero of="$out/dd" bs=16M count=64 oflag=direct 2>&1 | awk 'END{print "disk write " $(NF-1), $NF}'
  dd if="$out/dd" of=/dev/null bs=16M iflag=direct 2>&1 | awk 'END{print "disk read  " $(NF-1), $NF}'
  rm -f "$out/dd"
}
summary() {  # name, run dir: medians of steps 3.. (the first steps warm up)
  python3 - "$1" "$2" <<'PY'
import json, statistics, sys
name, d = sys.argv[1], sys.argv[2]
rows = [json.loads(l) for l in open(d + "/metrics.jsonl") if '"loss"' in l][2:]
med = lambda f: statistics.median(f(r) for r in rows)
print(f"{name:24s} step {med(lambda r: r['step_ms']):8.1f} ms  {med(lambda r: r['tokens_per_s']):6.0f} tok/s  "
      f"MFU {100 * med(lambda r: r['mfu']):5.1f}%  tracked peak {med(lambda r: r['mem']['total']) / 1e6:7.1f} MB  "
      f"peak RSS {med(lambda r: r['peak_rss']) / 1e6:7.1f} MB")
if "offload" in rows[0]:
    for part in ("units", "update"):
        g = lambda k: med(lambda r: r["offload"][part][k])
        io, wait = g("io_ms"), g("wait_ms")
        hidden = max(0.0, 1 - wait / io) if io > 0 else 0
        print(f"  {part:7s} read {g('read_bytes') / 1e6:8.1f} MB  written {g('written_bytes') / 1e6:8.1f} MB  "
              f"io {io:8.1f} ms  exposed {wait:8.1f} ms  hidden {100 * hidden:5.1f}%")
PY
}
"$bin" bench peak
disk
"$bin" train "${model[@]}" --out "$out/memory"
summary "ZeRO-3 in memory" "$out/memory"
"$bin" train "${model[@]}" --offload params=nvme,grads=nvme --offload-dir "$out/files" --out "$out/files_run"
summary "params+grads in files" "$out/files_run"
"$bin" train "${model[@]}" --offload params=nvme,grads=nvme,optimizer=nvme --offload-dir "$out/files" \
  --out "$out/all_run"
summary "params+grads+optimizer" "$out/all_run"
