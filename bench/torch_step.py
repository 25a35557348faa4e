#!/usr/bin/python3
"""The PyTorch peer of `meshtrain bench step` and `bench/dp.sh`: training steps (forward,
backward, AdamW) of gpt2-124m or llama-124m (or a GPT-2 of other --layers/--dim/--heads) on
random tokens with the reference models of tests/reference (eager PyTorch, fp32, or bf16
autocast), timed on this machine.

    /usr/bin/python3 bench/torch_step.py --arch gpt2|llama [--batch 8] [--seq-len 256]
        [--steps 3] [--warmup 1] [--threads N (default: all cores)] [--bf16]
        [--layers L --dim C --heads H (gpt2)] [--ddp N]

--ddp N runs N processes under torch.nn.parallel.DistributedDataParallel (gloo on
127.0.0.1), each with the cores / N threads and batch / N of the rows, as `meshtrain train
--dp N` splits them. Prints one line: the median step time and tokens/s (of all processes).
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


def gpt2_params(L=12, C=768, H=12, maxT=1024):
    p = {"wte.weight": (V, C), "wpe.weight": (maxT, C), "ln_f.weight": (C,), "ln_f.bias": (C,)}
    for i in range(L):
        for name, shape in (("ln_1.weight", (C,)), ("ln_1.bias", (C,)), ("attn.c_attn.weight", (C, 3 * C)),
                            ("attn.c_attn.bias", (3 * C,)), ("attn.c_proj.weight", (C, C)), ("attn.c_proj.bias", (C,)),
                            ("ln_2.weight", (C,)), ("ln_2.bias", (C,)), ("mlp.c_fc.weight", (C, 4 * C)),
                            ("mlp.c_fc.bias", (4 * C,)), ("mlp.c_proj.weight", (4 * C, C)), ("mlp.c_proj.bias", (C,))):
            p["h.%d.%s" % (i, name)] = shape
    return p, lambda params, idx: torch_gpt2.forward(params, "", L, H, idx)


def llama_params():
    # llama-124m: 12 layers, C 768, 12 heads, 4 kv heads, SwiGLU 2304, tied head.
    cfg = {"num_hidden_layers": 12, "num_attention_heads": 12, "num_key_value_heads": 4, "hidden_size": 768,
           "intermediate_size": 2304, "vocab_size": V, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
           "rope_scaling": None, "tie_word_embeddings": True}
    return torch_llama.expected_shapes(cfg), lambda params, idx: torch_llama.forward(params, cfg, idx)


class Functional(torch.nn.Module):
    """The functional reference model's tensors as a Module's parameters, for DDP."""

    def __init__(self, params, model):
        super().__init__()
        self.names = list(params)
        self.weights = torch.nn.ParameterList([torch.nn.Parameter(params[n].detach()) for n in self.names])
        self.model = model

    def forward(self, idx):
        return self.model(dict(zip(self.names, self.weights)), idx)


def run(rank, a, world=1):
    if world > 1:
        torch.distributed.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % a.port, rank=rank,
                                             world_size=world)
    threads = a.threads if a.threads > 0 else max(1, os.cpu_count() // world)
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    shapes, model = gpt2_params(a.layers, a.dim, a.heads) if a.arch == "gpt2" else llama_params()
    params = {n: (torch.randn(s) * 0.02 if len(s) > 1 else torch.ones(s)) for n, s in shapes.items()}
    net = Functional(params, model)
    if world > 1:
        net = torch.nn.parallel.DistributedDataParallel(net)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-4)
    rows = a.batch // world
    times = []
    torch.manual_seed(1 + rank)
    for step in range(a.warmup + a.steps):
        idx = torch.randint(0, V, (rows, a.seq_len + 1))
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16):
            logits = net(idx[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, V), idx[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step >= a.warmup:
            times.append(time.perf_counter() - t0)
    t = statistics.median(times)
    if rank == 0:
        kind = ("DDP x%d, " % world) if world > 1 else ""
        print("torch %s %s: %sB=%d T=%d, %d threads each: %.0f ms/step, %.1f tokens/s" %
              (a.arch, "bf16 autocast" if a.bf16 else "fp32", kind, a.batch, a.seq_len, threads, t * 1e3,
               a.batch * a.seq_len / t))
    if world > 1:
        torch.distributed.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", choices=["gpt2", "llama"], required=True)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--ddp", type=int, default=1)
    ap.add_argument("--port", type=int, default=29517)
    a = ap.parse_args()
    if a.ddp > 1:
        if a.batch % a.ddp:
            sys.exit("--batch must divide over --ddp processes")
        torch.multiprocessing.spawn(run, args=(a, a.ddp), nprocs=a.ddp)
    else:
        run(0, a)


if __name__ == "__main__":
    main()
