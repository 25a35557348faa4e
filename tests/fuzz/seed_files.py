"""Small seed files for the fuzz targets that no meshtrain command writes (make_seeds.sh).

  seed_files.py token-data DIR            train.bin / val.bin with ids < 100 for a tiny run
  seed_files.py handmade CORPUS TRAIN_BIN hand-built files for several targets
  seed_files.py bpe TOKENIZER_DIR OUT_DIR an excerpt of GPT-2's encoder.json and vocab.bpe
  seed_files.py http OUT_DIR              HTTP requests as clients of `meshtrain serve` send them
"""
import json
import os
import random
import struct
import sys


def token_file(tokens):
    header = [20240520, 1, len(tokens)] + [0] * 253
    return struct.pack("<256i", *header) + struct.pack("<%dH" % len(tokens), *tokens)


def write(path, data):
    with open(path, "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def token_data(out):
    os.makedirs(out, exist_ok=True)
    rng = random.Random(1)
    tokens = [rng.randrange(100) for _ in range(4000)]
    write(os.path.join(out, "train.bin"), token_file(tokens))
    write(os.path.join(out, "val.bin"), token_file(tokens[:600]))


def safetensors(tensors, metadata):
    """tensors: (name, dtype, shape, raw bytes), laid out in order."""
    header, data = {}, b""
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    header["__metadata__"] = metadata
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


def smallest_llmc():
    # layers 1, heads 1, dim 1, vocab 2 (padded 2), 1 position: 2 + 1 + 25 + 2 floats.
    header = [20240326, 3, 1, 2, 1, 1, 1, 2] + [0] * 248
    floats = [0.5 * i for i in range(30)]
    return struct.pack("<256i", *header) + struct.pack("<30f", *floats)


def handmade(corpus, train_bin):
    write(os.path.join(corpus, "fuzz_safetensors", "dtypes.safetensors"), safetensors(
        [("h", "F16", [3], struct.pack("<3H", 0x3C00, 0xC000, 0x0001)),
         ("b", "BF16", [2, 1], struct.pack("<2H", 0x3F80, 0xC060)),
         ("d", "F64", [1], struct.pack("<d", 3.25)),
         ("i", "I32", [], struct.pack("<i", 7)),
         ("e", "F32", [0, 4], b"")],
        {"format": "pt", "n_head": "1"}))
    write(os.path.join(corpus, "fuzz_llmc_model", "smallest.bin"), smallest_llmc())
    with open(train_bin, "rb") as f:
        tokens = list(struct.unpack("<4000H", f.read()[1024:1024 + 8000]))
    write(os.path.join(corpus, "fuzz_token_file", "short.bin"), token_file(tokens[:64]))
    write(os.path.join(corpus, "fuzz_token_file", "empty.bin"), token_file([]))
    write(os.path.join(corpus, "fuzz_cluster_file", "based.toml"),
          'name = "a100-40g-slow-ib"\nbase = "a100-80g"\nmemory_gb = 40\n'
          "inter_node_gbps = 12.5        # GB/s per GPU, one direction\n"
          "inter_node_latency_us = 8\ngemm_max_fraction = 0.75\n")
    write(os.path.join(corpus, "fuzz_cluster_file", "full.toml"),
          'name = "my-cluster"\npeak_tflops_bf16 = 312\npeak_tflops_fp32 = 19.5\nmemory_gb = 80\n'
          "hbm_gbps = 2039\ngpus_per_node = 8\nintra_node_gbps = 300\nintra_node_latency_us = 2\n"
          "inter_node_gbps = 25\ninter_node_latency_us = 5\ngemm_max_fraction = 0.78\n"
          "gemm_half_dim = 64\nhbm_efficiency = 0.6\nlink_efficiency = 0.7\nreserved_gb = 2\n")
    write(os.path.join(corpus, "fuzz_cluster_file", "tables.toml"),
          'name = "two-hosts"\nbase = "h100-80g"\n[hosts]\ncount = 2\nranks_per_host = 2\nnics_per_host = 1\n'
          "[links.intra_host]\nbandwidth_gbs = 5.3\nlatency_us = 3.5\n"
          "[links.inter_host]\nbandwidth_gbs = 0.064\nlatency_us = 12\nreduce_scatter_gbs = 0.04\n"
          "all_gather_gbs = 0.067\n")
    write(os.path.join(corpus, "fuzz_config_toml", "kinds.toml"),
          '# one key of each kind\nmodel = "tiny"\nprecision = "bf16"\nquiet = true\n'
          "stage_layers = [1, 1]\n"
          'seed = "18446744073709551615"  # above 2^63: a TOML integer stops at 2^63 - 1\n'
          "zero = 2\nbucket-mb = 12.5\n"
          "out = 'runs/a b'\nlr = -1e-3\n")


def bpe(tokenizer_dir, out, merges=300):
    with open(os.path.join(tokenizer_dir, "encoder.json"), encoding="utf-8") as f:
        encoder = json.load(f)
    with open(os.path.join(tokenizer_dir, "vocab.bpe"), encoding="utf-8") as f:
        lines = f.read().split("\n")
    pairs = [line.split(" ") for line in lines[1:1 + merges]]
    by_id = sorted(encoder.items(), key=lambda kv: kv[1])
    keep = [t for t, _ in by_id[:256]]  # GPT-2's first 256 ids are the byte tokens
    for left, right in pairs:
        for t in (left, right, left + right):
            if t not in keep:
                keep.append(t)
    keep.append("<|endoftext|>")
    excerpt = json.dumps({t: i for i, t in enumerate(keep)}, ensure_ascii=False)
    vocab = lines[0] + "\n" + "\n".join(" ".join(p) for p in pairs) + "\n"
    text = "The jury said it's 42 times  hello\u00e9 world\n\t<|endoftext|>x"
    write(os.path.join(out, "excerpt"), excerpt + "\0" + vocab + "\0" + text)
    minimal = json.dumps({t: i for i, t in enumerate(keep[:256] + ["\u0120t", "<|endoftext|>"])},
                         ensure_ascii=False)
    write(os.path.join(out, "minimal"), minimal + "\0#version: 0.2\n\u0120 t\n\0 tt t")


def http_requests(out):
    """What curl, Python's urllib and OpenAI's clients send to `meshtrain serve`, and a few
    requests the parser must refuse."""
    os.makedirs(out, exist_ok=True)
    body = json.dumps({"prompt": "It was", "max_tokens": 5, "temperature": 0.9, "seed": 4})
    seeds = {
        "curl_post": "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nUser-Agent: curl/7.88.1\r\n"
                     "Accept: */*\r\nContent-Length: %d\r\nContent-Type: application/x-www-form-urlencoded\r\n\r\n%s"
                     % (len(body), body),
        "urllib_post": "POST /v1/completions HTTP/1.1\r\nAccept-Encoding: identity\r\nContent-Type: application/json\r\n"
                       "Content-Length: %d\r\nHost: localhost\r\nConnection: close\r\n\r\n%s" % (len(body), body),
        "pipelined": "GET /health HTTP/1.1\r\nHost: a\r\n\r\nGET /metrics?x=1 HTTP/1.1\r\nHost: a\r\n\r\n",
        "http10": "GET /stats HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
        "expect": "POST /v1/completions HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 100\r\n\r\n",
        "chunked": "POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        "folded": "GET / HTTP/1.1\r\nA: b\r\n c\r\n\r\n",
        "bare_lf": "GET / HTTP/1.1\nHost: a\n\n",
    }
    for name, text in seeds.items():
        write(os.path.join(out, name + ".http"), text)


if __name__ == "__main__":
    {"token-data": token_data, "handmade": handmade, "bpe": bpe, "http": http_requests}[sys.argv[1]](*sys.argv[2:])
