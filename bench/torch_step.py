#!/usr/bin/python3
"""The PyTorch peer of `meshtrain bench step`: training steps (forward, backward, AdamW) of
gpt2-124m or llama-124m on random tokens with the reference models of tests/reference
(eager PyTorch, fp32, or bf16 autocast), timed on this machine.

    /usr/bin/python3 bench/torch_step.py --arch gpt2|llama [--batch 8] [--seq-len 256]
        [--steps 3] [--warmup 1] [--threads N (default: all cores)] [--bf16]

Prints one line: the median step time and tokens/s.
"""
import argparse
import os
import statistics
import sys
import time

import torch

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "tests", "reference"))
import torch_gpt2  # noqa: E402
import torch_llama  # noqa: E402

V = 50257


def gpt2_params(L=12, C=768, maxT=1024):
    p = {"wte.weight": (V, C), "wpe.weight": (maxT, C), "ln_f.weight": (C,), "ln_f.bias": (C,)}
    for i in range(L):
        for name, shape in (("ln_1.weight", (C,)), ("ln_1.bias", (C,)), ("attn.c_attn.weight", (C, 3 * C)),
                            ("attn.c_attn.bias", (3 * C,)), ("attn.c_proj.weight", (C, C)), ("attn.c_proj.bias", (C,)),
                            ("ln_2.weight", (C,)), ("ln_2.bias", (C,)), ("mlp.c_fc.weight", (C, 4 * C)),
                            ("mlp.c_fc.bias", (4 * C,)), ("mlp.c_proj.weight", (4 * C, C)), ("mlp.c_proj.bias", (C,))):
            p["h.%d.%s" % (i, name)] = shape
    return p, lambda params, idx: torch_gpt2.forward(params, "", L, 12, idx)


def llama_params():
    # llama-124m: 12 layers, C 768, 12 heads, 4 kv heads, SwiGLU 2304, tied head.
    cfg = {"num_hidden_layers": 12, "num_attention_heads": 12, "num_key_value_heads": 4, "hidden_size": 768,
           "intermediate_size": 2304, "vocab_size": V, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
           "rope_scaling": None, "tie_word_embeddings": True}
    return torch_llama.expected_shapes(cfg), lambda params, idx: torch_llama.forward(params, cfg, idx)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", choices=["gpt2", "llama"], required=True)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--bf16", action="store_true")
    a = ap.parse_args()
    # All cores, as `meshtrain bench step` uses (this torch build starts with one thread here).
    torch.set_num_threads(a.threads if a.threads > 0 else os.cpu_count())
    torch.manual_seed(0)
    shapes, model = gpt2_params() if a.arch == "gpt2" else llama_params()
    params = {n: (torch.randn(s) * 0.02 if len(s) > 1 else torch.ones(s)).requires_grad_(True) for n, s in shapes.items()}
    opt = torch.optim.AdamW(list(params.values()), lr=1e-4)
    times = []
    for step in range(a.warmup + a.steps):
        idx = torch.randint(0, V, (a.batch, a.seq_len + 1))
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16):
            logits = model(params, idx[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, V), idx[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step >= a.warmup:
            times.append(time.perf_counter() - t0)
    t = statistics.median(times)
    print("torch %s %s: B=%d T=%d, %d threads: %.0f ms/step, %.1f tokens/s" %
          (a.arch, "bf16 autocast" if a.bf16 else "fp32", a.batch, a.seq_len, torch.get_num_threads(), t * 1e3,
           a.batch * a.seq_len / t))


if __name__ == "__main__":
    main()
