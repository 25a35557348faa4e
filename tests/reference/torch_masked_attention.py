"""Document-masked causal attention in PyTorch (float64, autograd), the reference for
meshtrain's attention by key ranges (tests/unit/test_long_context_kernels.cc).

Usage: torch_masked_attention.py DIR B T NH NKV HS
Reads DIR/{q,k,v,dout,doc_start}.bin (raw float64: q and dout [B,T,NH*HS], k and v
[B,T,NKV*HS], doc_start [B,T] the first token of each token's document) and writes
DIR/{out,dq,dk,dv}.bin: the attention output and the gradients of sum(out * dout).
The mask is built explicitly, [B,T,T]: query i sees key j when doc_start[i] <= j <= i.
"""
import sys

import numpy as np
import torch


def load(directory, name, shape):
    return torch.from_numpy(np.fromfile(f"{directory}/{name}.bin", dtype="<f8").reshape(shape))


def main():
    directory = sys.argv[1]
    B, T, NH, NKV, HS = (int(a) for a in sys.argv[2:7])
    q = load(directory, "q", (B, T, NH, HS)).requires_grad_()
    k = load(directory, "k", (B, T, NKV, HS)).requires_grad_()
    v = load(directory, "v", (B, T, NKV, HS)).requires_grad_()
    dout = load(directory, "dout", (B, T, NH * HS))
    doc_start = load(directory, "doc_start", (B, T)).long()

    keys = torch.arange(T)
    visible = (keys[None, None, :] <= keys[None, :, None]) & (keys[None, None, :] >= doc_start[:, :, None])
    group = NH // NKV
    kh = k.repeat_interleave(group, dim=2).transpose(1, 2)  # [B, NH, T, HS]
    vh = v.repeat_interleave(group, dim=2).transpose(1, 2)
    qh = q.transpose(1, 2)
    scores = qh @ kh.transpose(-1, -2) / HS ** 0.5
    scores = scores.masked_fill(~visible[:, None, :, :], float("-inf"))
    out = (scores.softmax(dim=-1) @ vh).transpose(1, 2).reshape(B, T, NH * HS)
    (out * dout).sum().backward()

    for name, tensor in (("out", out), ("dq", q.grad), ("dk", k.grad), ("dv", v.grad)):
        tensor.detach().contiguous().numpy().astype("<f8").tofile(f"{directory}/{name}.bin")


if __name__ == "__main__":
    main()
