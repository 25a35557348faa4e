#!/usr/bin/python3
"""PyTorch reference implementation of Llama training, used by the C++ tests.

An independent Llama (RMSNorm, rotary positions, grouped-query attention,
SwiGLU, no biases, tied or untied head) built from a Hugging Face LlamaConfig
config.json, trained exactly as tests/reference/torch_gpt2.py trains GPT-2
(same data windows, AdamW groups, schedule, clipping, accumulation, outputs).

Usage:
    /usr/bin/python3 tests/reference/torch_llama.py --config config.json \
        --init INIT.safetensors --tokens TOKENS.bin [the optimizer and batch
        flags of torch_gpt2.py] --out OUT.safetensors [--dtype float64|float32]

Inputs
  config.json       LlamaConfig fields: num_hidden_layers, num_attention_heads,
                    num_key_value_heads, hidden_size, intermediate_size,
                    vocab_size, rms_norm_eps, rope_theta, rope_scaling (null,
                    or rope_type "llama3" with factor, low_freq_factor,
                    high_freq_factor, original_max_position_embeddings),
                    tie_word_embeddings.
  INIT.safetensors  (or a sharded model's model.safetensors.index.json)
                    Hugging Face Llama names, nn.Linear weights [out, in]:
                      model.embed_tokens.weight [V, C],
                      model.layers.{i}.input_layernorm.weight [C],
                      model.layers.{i}.self_attn.{q,k,v,o}_proj.weight,
                      model.layers.{i}.post_attention_layernorm.weight [C],
                      model.layers.{i}.mlp.{gate,up,down}_proj.weight,
                      model.norm.weight [C], lm_head.weight [V, C] (untied).

Model
  x = embed[idx]; per block x += o(attn(rope(q(n1(x))), rope(k(n1(x))),
  v(n1(x)))), x += down(silu(gate(n2(x))) * up(n2(x))); RMSNorm
  y = x / sqrt(mean(x^2) + eps) * w; rotary positions in Hugging Face's
  rotate_half form (column i of a head pairs with i + hs/2, angle
  pos * theta^(-2i/hs)); key/value head g serves query heads
  g*H/KV .. (g+1)*H/KV - 1; logits = norm(x) @ head.T.

Mixture of Experts (config.json with model_type "mixtral", num_local_experts,
num_experts_per_tok, intermediate_size the experts' width, and meshtrain's
"meshtrain_moe" extras): see moe_mlp. The balance losses join the objective, not
the reported loss; --moe-aux-loss, --moe-z-loss, --moe-capacity-factor set them.
"""
import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_gpt2 as common  # safetensors and token files, the schedule, the flags  # noqa: E402

RefError = common.RefError


def inverse_frequencies(hs, theta, scaling):
    inv = [theta ** (-2.0 * i / hs) for i in range(hs // 2)]
    if not scaling:
        return inv
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    orig = scaling["original_max_position_embeddings"]
    out = []
    for f in inv:
        wavelen = 2 * math.pi / f
        if wavelen < orig / high:
            out.append(f)
        elif wavelen > orig / low:
            out.append(f / factor)
        else:
            smooth = (orig / wavelen - low) / (high - low)
            out.append((1 - smooth) * f / factor + smooth * f)
    return out


def rotate(x, cos, sin):
    """x: [B, heads, T, hs]; cos, sin: [T, hs/2]."""
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)


def rms_norm(x, w, eps):
    return x / torch.sqrt((x * x).mean(dim=-1, keepdim=True) + eps) * w


def forward(p, cfg, idx, train=None):
    B, T = idx.shape
    extra = 0.0
    L, H, KV = cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    C, eps = cfg["hidden_size"], cfg["rms_norm_eps"]
    hs = C // H
    inv = torch.tensor(inverse_frequencies(hs, cfg["rope_theta"], cfg.get("rope_scaling")))
    angle = torch.arange(T, dtype=inv.dtype)[:, None] * inv[None, :]
    cos, sin = torch.cos(angle), torch.sin(angle)
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    x = p["model.embed_tokens.weight"][idx]
    for i in range(L):
        g = lambda s: p["model.layers.%d.%s" % (i, s)]
        h = rms_norm(x, g("input_layernorm.weight"), eps)
        q = (h @ g("self_attn.q_proj.weight").t()).view(B, T, H, hs).transpose(1, 2)
        k = (h @ g("self_attn.k_proj.weight").t()).view(B, T, KV, hs).transpose(1, 2)
        v = (h @ g("self_attn.v_proj.weight").t()).view(B, T, KV, hs).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        k = k.repeat_interleave(H // KV, dim=1)
        v = v.repeat_interleave(H // KV, dim=1)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        att = torch.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + y @ g("self_attn.o_proj.weight").t()
        h = rms_norm(x, g("post_attention_layernorm.weight"), eps)
        if is_moe_layer(cfg, i):
            y, layer_extra = moe_mlp(g, cfg, train, h)
            x = x + y
            extra = extra + layer_extra
            continue
        gate = h @ g("mlp.gate_proj.weight").t()
        up = h @ g("mlp.up_proj.weight").t()
        x = x + (F.silu(gate) * up) @ g("mlp.down_proj.weight").t()
    x = rms_norm(x, p["model.norm.weight"], eps)
    head = p["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings") else p["lm_head.weight"]
    logits = x @ head.t()
    return (logits, extra) if moe_settings(cfg) else logits


# ---- Mixture of Experts (Mixtral's config and names; docs/moe.md) ----

def moe_settings(cfg):
    """None for a dense Llama, else the MoE architecture: Mixtral's fields plus meshtrain's."""
    if cfg.get("model_type") != "mixtral":
        return None
    extra = cfg.get("meshtrain_moe", {})
    return {"E": cfg["num_local_experts"], "k": cfg["num_experts_per_tok"], "every": extra.get("every", 1),
            "shared": extra.get("shared_experts", 0), "score": extra.get("score", "softmax"),
            "renormalize": extra.get("renormalize", True)}


def is_moe_layer(cfg, i):
    m = moe_settings(cfg)
    return m is not None and i % m["every"] == 0


def swiglu(h, gate, up, down):
    return (F.silu(h @ gate.t()) * (h @ up.t())) @ down.t()


def moe_mlp(g, cfg, train, h):
    """Router, top-k, per-sequence capacity and balance losses, experts, shared experts.
    Every expert runs on every token (tiny shapes): a token's output is the sum of its kept
    choices' weighted outputs, so an unchosen expert contributes, and receives, nothing."""
    m = moe_settings(cfg)
    B, T, C = h.shape
    E, k = m["E"], m["k"]
    logits = h @ g("block_sparse_moe.gate.weight").t()  # [B, T, E]
    scores = torch.softmax(logits, dim=-1) if m["score"] == "softmax" else torch.sigmoid(logits)
    top, chosen = torch.topk(scores, k, dim=-1)  # [B, T, k], by descending score
    weights = top / top.sum(dim=-1, keepdim=True) if m["renormalize"] else top
    keep = torch.ones(B, T, k, dtype=torch.bool)
    if train["capacity_factor"] > 0:  # choice by choice, then by position, per sequence
        cap = math.ceil(k * T * train["capacity_factor"] / E)
        for b in range(B):
            taken = [0] * E
            for j in range(k):
                for t in range(T):
                    e = int(chosen[b, t, j])
                    keep[b, t, j] = taken[e] < cap
                    taken[e] += int(keep[b, t, j])
    out = torch.zeros_like(h)
    if m["shared"] > 0:
        out = out + swiglu(h, g("block_sparse_moe.shared_experts.gate_proj.weight"),
                           g("block_sparse_moe.shared_experts.up_proj.weight"),
                           g("block_sparse_moe.shared_experts.down_proj.weight"))
    for e in range(E):
        w = (weights * ((chosen == e) & keep)).sum(dim=-1, keepdim=True)  # [B, T, 1]
        pre = "block_sparse_moe.experts.%d." % e
        out = out + w * swiglu(h, g(pre + "w1.weight"), g(pre + "w3.weight"), g(pre + "w2.weight"))
    # Balance loss per sequence: alpha * E * sum_e f_e P_e, f over every choice before drops.
    f = torch.stack([(chosen == e).sum(dim=(1, 2)) for e in range(E)], dim=-1).to(h.dtype) / (k * T)  # [B, E]
    q = scores if m["score"] == "softmax" else scores / scores.sum(dim=-1, keepdim=True)
    P = q.mean(dim=1)  # [B, E]
    extra = (train["aux_loss"] * E * (f * P).sum(dim=-1)).mean()
    if train["z_loss"] > 0:
        extra = extra + train["z_loss"] * (torch.logsumexp(logits, dim=-1) ** 2).mean()
    return out, extra


def expected_shapes(cfg):
    L, H, KV = cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    C, Fw, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    if C % H or H % KV:
        raise RefError("hidden_size %d, heads %d, kv heads %d do not divide" % (C, H, KV))
    KVd = KV * (C // H)
    shapes = {"model.embed_tokens.weight": (V, C), "model.norm.weight": (C,)}
    if not cfg.get("tie_word_embeddings"):
        shapes["lm_head.weight"] = (V, C)
    for i in range(L):
        for name, shape in (("input_layernorm.weight", (C,)), ("post_attention_layernorm.weight", (C,)),
                            ("self_attn.q_proj.weight", (C, C)), ("self_attn.k_proj.weight", (KVd, C)),
                            ("self_attn.v_proj.weight", (KVd, C)), ("self_attn.o_proj.weight", (C, C))):
            shapes["model.layers.%d.%s" % (i, name)] = shape
        if is_moe_layer(cfg, i):
            m = moe_settings(cfg)
            mlp = [("block_sparse_moe.gate.weight", (m["E"], C))]
            Fs = m["shared"] * Fw
            if Fs:
                mlp += [("block_sparse_moe.shared_experts.gate_proj.weight", (Fs, C)),
                        ("block_sparse_moe.shared_experts.up_proj.weight", (Fs, C)),
                        ("block_sparse_moe.shared_experts.down_proj.weight", (C, Fs))]
            for e in range(m["E"]):
                pre = "block_sparse_moe.experts.%d." % e
                mlp += [(pre + "w1.weight", (Fw, C)), (pre + "w3.weight", (Fw, C)), (pre + "w2.weight", (C, Fw))]
        else:
            Fd = cfg.get("meshtrain_moe", {}).get("dense_intermediate_size", Fw)
            mlp = [("mlp.gate_proj.weight", (Fd, C)), ("mlp.up_proj.weight", (Fd, C)), ("mlp.down_proj.weight", (C, Fd))]
        for name, shape in mlp:
            shapes["model.layers.%d.%s" % (i, name)] = shape
    return shapes


def run(args):
    with open(args.config) as f:
        cfg = json.load(f)
    raw = common.read_safetensors(args.init)
    shapes = expected_shapes(cfg)
    for name, shape in shapes.items():
        if name not in raw:
            raise RefError("init file is missing %r" % name)
        if tuple(raw[name].shape) != shape:
            raise RefError("%r has shape %r, want %r" % (name, tuple(raw[name].shape), shape))
    extra = sorted(set(raw) - set(shapes))
    if extra:
        raise RefError("unexpected tensors %r" % extra)
    names = list(shapes)
    V = cfg["vocab_size"]
    train = {"aux_loss": args.moe_aux_loss, "z_loss": args.moe_z_loss, "capacity_factor": args.moe_capacity_factor}
    model = lambda params, idx: forward(params, cfg, idx, train)
    common.train(args, raw, names, V, model, "torch_llama")


def main(argv=None):
    ap = common.make_parser("PyTorch reference Llama trainer (see module docstring).", heads=False)
    ap.add_argument("--config", required=True)
    # MoE training settings (a Mixtral config's model): meshtrain's --moe-* flags.
    ap.add_argument("--moe-aux-loss", type=float, default=0.01)
    ap.add_argument("--moe-z-loss", type=float, default=0.0)
    ap.add_argument("--moe-capacity-factor", type=float, default=0.0)
    return common.run_reporting_errors(run, ap.parse_args(argv), "torch_llama.py")


if __name__ == "__main__":
    sys.exit(main())
