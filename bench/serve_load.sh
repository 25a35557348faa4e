#!/usr/bin/env bash
# `meshtrain serve` under concurrent load on 127.0.0.1: a tiny model trained for 2 steps
# (as bench/serve.sh), served with its default limits, and a load generator of its own
# (bench/serve_load.py: python3 asyncio, one connection per request, as many clients as
# asked, each sending completions back to back for SECONDS). For each number of concurrent
# clients it prints requests answered 200 and 503 (with Retry-After), connections reset or
# failed, requests/s and generated tokens/s, and the p50 and p99 latency of the 200s.
# Usage: bench/serve_load.sh [CLIENTS ("1 16 64 256")] [SECONDS (10)] [MAX_TOKENS (16)] [SERVE_FLAGS]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="$root/build/meshtrain"
dir="$(mktemp -d)"
server=""
trap '[ -n "$server" ] && kill "$server" 2>/dev/null; rm -rf "$dir"' EXIT
clients="${1:-1 16 64 256}" seconds="${2:-10}" max_tokens="${3:-16}" flags="${4:-}"
[ -f "$root/data/brown/train.bin" ] || "$bin" prep --brown --out "$root/data/brown" >/dev/null
"$bin" train --data "$root/data/brown" --model "${MODEL:-tiny}" --seq-len 64 --micro-batch 2 --steps 2 --quiet \
  --out "$dir/tiny" >/dev/null
"$bin" serve --checkpoint "$dir/tiny" --port 0 --threads 1 $flags >"$dir/serve.out" 2>&1 &
server=$!
for _ in $(seq 300); do grep -q "http://" "$dir/serve.out" 2>/dev/null && break; sleep 0.1; done
url="$(grep -oE 'http://[0-9.]+:[0-9]+' "$dir/serve.out")"
echo "$(date -u +%Y-%m-%d); $(nproc) cores; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "serve --threads 1 $flags; ${MODEL:-tiny} model; $max_tokens tokens per request; $seconds s per row"
python3 "$root/bench/serve_load.py" "$url" "$seconds" "$max_tokens" $clients
kill "$server"
wait "$server" 2>/dev/null || true
server=""
