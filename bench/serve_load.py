"""The load generator of bench/serve_load.sh: for each count C, C asyncio clients send
completions back to back, each on a new connection, for a fixed time, and the table line
says what came back. Plain asyncio streams, so that a reset or a refused connection is
counted as one and nothing is retried behind our back.
Usage: serve_load.py URL SECONDS MAX_TOKENS C [C ...]"""
import asyncio
import json
import sys
import time


async def one_request(host, port, body):
    """(status, seconds, generated tokens); status 0 for a reset or failed connection."""
    t0 = time.perf_counter()
    try:
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n"
                     b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        reply = await reader.read()  # to the server's close
        writer.close()
    except (ConnectionError, OSError):
        return 0, time.perf_counter() - t0, 0
    seconds = time.perf_counter() - t0
    head, _, payload = reply.partition(b"\r\n\r\n")
    status = int(head.split(b" ")[1]) if head.startswith(b"HTTP/1.1 ") else 0
    if status == 503 and b"\r\nRetry-After: " not in head:
        status = -503  # a 503 without Retry-After would be a bug
    tokens = json.loads(payload)["usage"]["completion_tokens"] if status == 200 else 0
    return status, seconds, tokens


async def level(host, port, clients, seconds, max_tokens):
    results = []
    deadline = time.perf_counter() + seconds

    async def client(k):
        i = 0
        while time.perf_counter() < deadline:
            body = json.dumps({"prompt": "The jury said that", "max_tokens": max_tokens,
                               "seed": 1000 * k + i, "temperature": 1.0}).encode()
            results.append(await one_request(host, port, body))
            i += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(client(k) for k in range(clients)))
    return results, time.perf_counter() - t0


def quantile(sorted_values, q):
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, max(0, round(q * len(sorted_values) + 0.5) - 1))]


def main():
    url, seconds, max_tokens = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
    host, port = url.removeprefix("http://").split(":")
    print("| clients | 200 | 503 | reset/failed | requests/s | tokens/s | p50 ms | p99 ms |")
    print("|---|---|---|---|---|---|---|---|")
    for clients in (int(c) for c in sys.argv[4:]):
        results, wall = asyncio.run(level(host, int(port), clients, seconds, max_tokens))
        ok = sorted(r[1] for r in results if r[0] == 200)
        busy = sum(1 for r in results if r[0] == 503)
        bad = sum(1 for r in results if r[0] not in (200, 503))
        tokens = sum(r[2] for r in results)
        print(f"| {clients} | {len(ok)} | {busy} | {bad} | {len(ok) / wall:.1f} | {tokens / wall:.0f} | "
              f"{quantile(ok, 0.5) * 1e3:.1f} | {quantile(ok, 0.99) * 1e3:.1f} |", flush=True)


if __name__ == "__main__":
    main()
