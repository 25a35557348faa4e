#!/usr/bin/env bash
# `meshtrain serve` under load on localhost: for each --max-batch B in BATCHES (a server of
# its own, continuous batching up to B sequences; 1 decodes one request at a time) and each
# number of concurrent clients C in CLIENTS, C threads send M requests each (a 4-token
# prompt, MAX_TOKENS sampled tokens, each request its own seed), then stop. Prints
# requests/s, generated tokens/s, the p50 and p99 latency per request, and the mean number
# of sequences per decode step (from GET /stats).
# Usage: bench/serve.sh [CHECKPOINT (a 2-step tiny run made here)] [M (8)] [MAX_TOKENS (32)]
#        [CLIENTS ("1 4 8")] [BATCHES ("1 8")]; MODEL=gpt2-124m (tiny) for the made run's size
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="$root/build/meshtrain"
dir="$(mktemp -d)"
server=""
trap '[ -n "$server" ] && kill "$server" 2>/dev/null; rm -rf "$dir"' EXIT
checkpoint="${1:-}" per_client="${2:-8}" max_tokens="${3:-32}" clients="${4:-1 4 8}" batches="${5:-1 8}"
[ -f "$root/data/brown/train.bin" ] || "$bin" prep --brown --out "$root/data/brown" >/dev/null
if [ -z "$checkpoint" ]; then
  checkpoint="$dir/tiny"
  "$bin" train --data "$root/data/brown" --model "${MODEL:-tiny}" --seq-len 64 --micro-batch 2 --steps 2 --quiet --out "$checkpoint" >/dev/null
fi
echo "$(nproc) cores; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
printf "%9s %7s %8s %7s %9s %8s %8s %10s\n" "max batch" clients requests "req/s" "tokens/s" "p50 ms" "p99 ms" "seqs/step"
for batch in $batches; do
"$bin" serve --checkpoint "$checkpoint" --port 0 --threads 1 --max-batch "$batch" >"$dir/serve.out" 2>&1 &
server=$!
for _ in $(seq 300); do grep -q "http://" "$dir/serve.out" 2>/dev/null && break; sleep 0.1; done
url="$(grep -oE 'http://[0-9.]+:[0-9]+' "$dir/serve.out")"
python3 - "$url" "$per_client" "$max_tokens" "$batch" $clients <<'PY'
import json, statistics, sys, threading, time, urllib.request
url, per_client, max_tokens, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
counts = [int(c) for c in sys.argv[5:]]
def ask(seed):
    body = json.dumps({"prompt": "The jury said that", "max_tokens": max_tokens, "seed": seed,
                       "temperature": 1.0}).encode()
    t0 = time.perf_counter()
    with urllib.request.urlopen(urllib.request.Request(url + "/v1/completions", data=body)) as r:
        reply = json.load(r)
    return time.perf_counter() - t0, reply["usage"]["completion_tokens"]
def stats():
    with urllib.request.urlopen(url + "/stats") as r:
        return json.load(r)
for c in counts:
    results = []
    lock = threading.Lock()
    def client(k):
        for i in range(per_client):
            r = ask(1000 * k + i)
            with lock:
                results.append(r)
    before = stats()
    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(k,)) for k in range(c)]
    for t in threads: t.start()
    for t in threads: t.join()
    wall = time.perf_counter() - t0
    after = stats()
    lat = sorted(r[0] for r in results)
    p99 = lat[min(len(lat) - 1, int(round(0.99 * (len(lat) - 1))))]
    tokens = sum(r[1] for r in results)
    # Each sequence is decoded in max_tokens steps (its prompt's prefill is its first).
    per_step = len(results) * max_tokens / max(1, after["steps"] - before["steps"])
    print(f"{batch:>9} {c:>7} {len(results):>8} {len(results) / wall:7.2f} {tokens / wall:9.1f} "
          f"{statistics.median(lat) * 1e3:8.1f} {p99 * 1e3:8.1f} {per_step:10.2f}")
PY
kill "$server"; wait "$server" 2>/dev/null || true
server=""
done
