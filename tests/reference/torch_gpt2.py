#!/usr/bin/python3
"""PyTorch reference implementation of GPT-2 training, used by the C++ tests.

Run it with Debian's system interpreter (the one that has PyTorch 1.13 and
numpy); nothing else is required.  Safetensors files are read and written by
hand, so the `safetensors` package is not needed.

Usage:
    /usr/bin/python3 tests/reference/torch_gpt2.py \
        --init INIT.safetensors --tokens TOKENS.bin --heads H \
        --batch B --seq-len T --steps S \
        --lr LR --min-lr MINLR --warmup-steps W --weight-decay WD \
        --beta1 B1 --beta2 B2 --eps EPS --grad-clip CLIP --grad-accum A \
        --out OUT.safetensors [--dtype float64|float32]

Inputs
  INIT.safetensors  GPT-2 weights with Hugging Face names and layouts
                    (Conv1D layout, y = x @ W + b):
                      wte.weight [V, C], wpe.weight [maxT, C],
                      h.{i}.ln_1.weight/bias [C],
                      h.{i}.attn.c_attn.weight [C, 3C], .bias [3C],
                      h.{i}.attn.c_proj.weight [C, C], .bias [C],
                      h.{i}.ln_2.weight/bias [C],
                      h.{i}.mlp.c_fc.weight [C, 4C], .bias [4C],
                      h.{i}.mlp.c_proj.weight [4C, C], .bias [C],
                      ln_f.weight/bias [C].
                    A common prefix "transformer." is accepted (and kept in
                    the output names).  Non-parameter tensors
                    (h.{i}.attn.bias / h.{i}.attn.masked_bias mask buffers,
                    lm_head.weight, which is tied to wte) are ignored.
                    Accepted dtypes: F64, F32, F16, BF16.
  TOKENS.bin        llm.c token file: 256 int32 header (magic 20240520,
                    version 1, token count at index 2), then count uint16
                    (version 2: uint32, meshtrain's for vocabularies past 65536).

Model
  GPT-2: x = wte[idx] + wpe[pos]; per block x += attn(ln_1(x)),
  x += mlp(ln_2(x)); LayerNorm eps 1e-5; causal attention with H heads,
  scale 1/sqrt(C/H), q,k,v are consecutive C-wide chunks of c_attn's output
  and head h uses columns h*hs:(h+1)*hs of each chunk; MLP GELU is the tanh
  approximation; final ln_f; logits = x @ wte.T (tied); loss = mean
  cross-entropy.  No dropout.  Everything runs in --dtype (default float64);
  the weights are converted after loading.

Data
  Global batch G = B*A rows per optimizer step.  Step k uses the window of
  G*T+1 tokens starting at (k mod E)*G*T, E = floor((count-1)/(G*T)).  Row j
  takes inputs tokens[p+j*T : p+(j+1)*T], targets shifted by one.  Micro-batch
  a takes rows a*B .. a*B+B-1; its mean loss over B*T tokens is divided by A
  before backward, so the accumulated gradient is that of the mean over G*T
  tokens.

Optimizer
  torch.optim.AdamW with two parameter groups: weight decay WD for tensors
  with 2 or more dims (all matmul weights and wte/wpe), 0 for biases and
  LayerNorm parameters.  torch's AdamW applies decoupled decay
  (p *= 1 - lr*wd) before the Adam update, and the bias-corrected update is
  p -= lr * m_hat / (sqrt(v_hat) + eps).  The learning rate for step s
  (0-based) of S is set before the step:
      s < W:  lr * (s+1) / W
      else:   min_lr + 0.5*(lr-min_lr)*(1 + cos(pi*(s-W)/max(1, S-W)))
  If CLIP > 0 the gradients are clipped with
  torch.nn.utils.clip_grad_norm_(params, CLIP), i.e. every gradient is scaled
  by min(1, CLIP / (norm + 1e-6)) where norm is the L2 norm over all
  parameters; that norm (before clipping) is recorded every step (also when
  CLIP <= 0, when nothing is clipped).

Output (OUT.safetensors)
  Tensors are written as F64 when --dtype float64 (full precision) and as
  F32 when --dtype float32.  Names:
    logits          [B, T, V]  logits of the first micro-batch of step 0,
                               before any update
    loss            [S]        loss of each step (mean over all G*T tokens,
                               before that step's update)
    grad_norm       [S]        total gradient norm per step, before clipping
    lr              [S]        learning rate used at each step
    grad.<name>     grad of every parameter at step 0 (all micro-batches
                    accumulated, before clipping); <name> is the input name
    final.<name>    every parameter after S steps
  The header's __metadata__ records the run configuration.

On success one summary line is printed to stdout; on error a message goes to
stderr and the exit status is 1.
"""

import argparse
import json
import math
import os
import re
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F


class RefError(Exception):
    pass


# ----------------------------------------------------------------------------
# safetensors I/O

_ST_DTYPES = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),  # converted by hand below
}


def read_safetensors(path):
    """A .safetensors file, or a sharded model's index (.index.json): its weight_map's
    shards, read one by one, each tensor from the shard the map names."""
    if path.endswith(".index.json"):
        try:
            with open(path) as f:
                weight_map = json.load(f)["weight_map"]
        except (OSError, ValueError, KeyError) as e:
            raise RefError("cannot read index %s: %s" % (path, e))
        folder = os.path.dirname(path)
        tensors = {}
        for shard in sorted(set(weight_map.values())):
            for name, t in read_safetensors(os.path.join(folder, shard)).items():
                if weight_map.get(name) != shard:
                    raise RefError("%s: %s holds %r, which its weight_map puts elsewhere" % (path, shard, name))
                tensors[name] = t
        missing = sorted(set(weight_map) - set(tensors))
        if missing:
            raise RefError("%s: no shard holds %r" % (path, missing))
        return tensors
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise RefError("cannot read %s: %s" % (path, e))
    if len(raw) < 8:
        raise RefError("%s: too short to be a safetensors file" % path)
    (n,) = struct.unpack("<Q", raw[:8])
    if 8 + n > len(raw):
        raise RefError("%s: header length %d exceeds file size" % (path, n))
    try:
        header = json.loads(raw[8:8 + n].decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise RefError("%s: bad JSON header: %s" % (path, e))
    if not isinstance(header, dict):
        raise RefError("%s: header is not a JSON object" % path)
    data = memoryview(raw)[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dt = info["dtype"]
            shape = [int(s) for s in info["shape"]]
            begin, end = (int(v) for v in info["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise RefError("%s: malformed entry for tensor %r" % (path, name))
        if dt not in _ST_DTYPES:
            raise RefError("%s: tensor %r has unsupported dtype %s" % (path, name, dt))
        npdt = _ST_DTYPES[dt]
        count = int(np.prod(shape)) if shape else 1
        if not (0 <= begin <= end <= len(data)) or end - begin != count * npdt.itemsize:
            raise RefError("%s: tensor %r has bad data_offsets %r for shape %r"
                           % (path, name, [begin, end], shape))
        arr = np.frombuffer(data[begin:end], dtype=npdt, count=count)
        if dt == "BF16":
            arr = (arr.astype(np.uint32) << 16).view(np.float32)
        out[name] = np.array(arr, dtype=np.float64).reshape(shape)
    return out


def write_safetensors(path, tensors, np_dtype, metadata=None):
    np_dtype = np.dtype(np_dtype).newbyteorder("<")
    st_name = {8: "F64", 4: "F32"}[np_dtype.itemsize]
    header = {}
    blobs = []
    offset = 0
    for name, arr in tensors.items():
        b = np.ascontiguousarray(arr, dtype=np_dtype).tobytes()
        header[name] = {"dtype": st_name, "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    hbytes = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hbytes += b" " * ((-len(hbytes)) % 8)  # align data section to 8 bytes
    try:
        with open(path, "wb") as f:
            f.write(struct.pack("<Q", len(hbytes)))
            f.write(hbytes)
            for b in blobs:
                f.write(b)
    except OSError as e:
        raise RefError("cannot write %s: %s" % (path, e))


# ----------------------------------------------------------------------------
# tokens

def read_tokens(path):
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise RefError("cannot read %s: %s" % (path, e))
    if len(raw) < 256 * 4:
        raise RefError("%s: too short for the 1024-byte token header" % path)
    header = np.frombuffer(raw[:1024], dtype="<i4")
    if header[0] != 20240520:
        raise RefError("%s: bad magic %d (want 20240520)" % (path, header[0]))
    widths = {1: ("<u2", 2), 2: ("<u4", 4)}  # llm.c's uint16; meshtrain's uint32
    if int(header[1]) not in widths:
        raise RefError("%s: unsupported version %d (want 1 or 2)" % (path, header[1]))
    dtype, width = widths[int(header[1])]
    count = int(header[2])
    if count < 0 or 1024 + width * count > len(raw):
        raise RefError("%s: header says %d tokens but file holds %d"
                       % (path, count, (len(raw) - 1024) // width))
    return np.frombuffer(raw[1024:1024 + width * count], dtype=dtype).astype(np.int64)


# ----------------------------------------------------------------------------
# model

_BLOCK_SHAPES = {
    "ln_1.weight": lambda C: (C,),
    "ln_1.bias": lambda C: (C,),
    "attn.c_attn.weight": lambda C: (C, 3 * C),
    "attn.c_attn.bias": lambda C: (3 * C,),
    "attn.c_proj.weight": lambda C: (C, C),
    "attn.c_proj.bias": lambda C: (C,),
    "ln_2.weight": lambda C: (C,),
    "ln_2.bias": lambda C: (C,),
    "mlp.c_fc.weight": lambda C: (C, 4 * C),
    "mlp.c_fc.bias": lambda C: (4 * C,),
    "mlp.c_proj.weight": lambda C: (4 * C, C),
    "mlp.c_proj.bias": lambda C: (C,),
}


def collect_params(raw):
    """Validate names/shapes; return (prefix, ordered list of names, L, V, C, maxT)."""
    prefix = "transformer." if "transformer.wte.weight" in raw else ""
    if prefix + "wte.weight" not in raw:
        raise RefError("init file has no wte.weight")
    wte = raw[prefix + "wte.weight"]
    if wte.ndim != 2:
        raise RefError("wte.weight must be 2-D, got shape %r" % (wte.shape,))
    V, C = wte.shape
    if prefix + "wpe.weight" not in raw:
        raise RefError("init file has no wpe.weight")
    wpe = raw[prefix + "wpe.weight"]
    if wpe.ndim != 2 or wpe.shape[1] != C:
        raise RefError("wpe.weight has shape %r, want [maxT, %d]" % (wpe.shape, C))
    maxT = wpe.shape[0]

    pat = re.compile(r"^" + re.escape(prefix) + r"h\.(\d+)\.(.+)$")
    layers = set()
    for name in raw:
        m = pat.match(name)
        if m:
            layers.add(int(m.group(1)))
    L = (max(layers) + 1) if layers else 0
    if sorted(layers) != list(range(L)):
        raise RefError("layer indices are not contiguous: %r" % sorted(layers))

    expected = {prefix + "wte.weight": (V, C), prefix + "wpe.weight": (maxT, C)}
    for i in range(L):
        for suffix, shp in _BLOCK_SHAPES.items():
            expected["%sh.%d.%s" % (prefix, i, suffix)] = shp(C)
    expected[prefix + "ln_f.weight"] = (C,)
    expected[prefix + "ln_f.bias"] = (C,)

    ignored = re.compile(r"^(" + re.escape(prefix) + r"h\.\d+\.attn\.(bias|masked_bias)|lm_head\.weight)$")
    for name, arr in raw.items():
        if name in expected:
            continue
        if ignored.match(name):
            continue
        raise RefError("unexpected tensor %r in init file" % name)
    for name, shp in expected.items():
        if name not in raw:
            raise RefError("init file is missing %r" % name)
        if tuple(raw[name].shape) != tuple(shp):
            raise RefError("%r has shape %r, want %r" % (name, tuple(raw[name].shape), shp))
    return prefix, list(expected.keys()), L, V, C, maxT


def layer_norm(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b, 1e-5)


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))


def forward(p, prefix, L, H, idx):
    """idx: [B, T] int64. Returns logits [B, T, V]."""
    B, T = idx.shape
    wte = p[prefix + "wte.weight"]
    wpe = p[prefix + "wpe.weight"]
    C = wte.shape[1]
    hs = C // H
    x = wte[idx] + wpe[:T].unsqueeze(0)
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    for i in range(L):
        g = lambda s: p["%sh.%d.%s" % (prefix, i, s)]
        h = layer_norm(x, g("ln_1.weight"), g("ln_1.bias"))
        qkv = h @ g("attn.c_attn.weight") + g("attn.c_attn.bias")
        q, k, v = qkv.split(C, dim=-1)
        q = q.view(B, T, H, hs).transpose(1, 2)
        k = k.view(B, T, H, hs).transpose(1, 2)
        v = v.view(B, T, H, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        att = att.masked_fill(~mask, float("-inf"))
        att = torch.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + (y @ g("attn.c_proj.weight") + g("attn.c_proj.bias"))
        h = layer_norm(x, g("ln_2.weight"), g("ln_2.bias"))
        h = gelu_tanh(h @ g("mlp.c_fc.weight") + g("mlp.c_fc.bias"))
        x = x + (h @ g("mlp.c_proj.weight") + g("mlp.c_proj.bias"))
    x = layer_norm(x, p[prefix + "ln_f.weight"], p[prefix + "ln_f.bias"])
    return x @ wte.t()


def lr_at(s, S, W, lr, min_lr):
    if s < W:
        return lr * (s + 1) / W
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * (s - W) / max(1, S - W)))


# ----------------------------------------------------------------------------

class _Parser(argparse.ArgumentParser):
    def error(self, message):  # exit 1 (not argparse's 2) on bad usage
        self.print_usage(sys.stderr)
        print("torch_gpt2.py: error: %s" % message, file=sys.stderr)
        sys.exit(1)


def make_parser(description, heads=True):
    """The flags every reference trainer takes (torch_llama.py adds --config)."""
    ap = _Parser(description=description)
    ap.add_argument("--init", required=True)
    ap.add_argument("--tokens", required=True)
    if heads:
        ap.add_argument("--heads", type=int, required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--seq-len", type=int, required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--lr", type=float, required=True)
    ap.add_argument("--min-lr", type=float, required=True)
    ap.add_argument("--warmup-steps", type=int, required=True)
    ap.add_argument("--weight-decay", type=float, required=True)
    ap.add_argument("--beta1", type=float, required=True)
    ap.add_argument("--beta2", type=float, required=True)
    ap.add_argument("--eps", type=float, required=True)
    ap.add_argument("--grad-clip", type=float, required=True)
    ap.add_argument("--grad-accum", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--dtype", choices=["float64", "float32"], default="float64")
    return ap


def parse_args(argv):
    return make_parser("PyTorch reference GPT-2 trainer (see module docstring).").parse_args(argv)


def run(args):
    H = args.heads
    if H < 1:
        raise RefError("--heads must be >= 1, got %d" % H)
    raw = read_safetensors(args.init)
    prefix, names, L, V, C, maxT = collect_params(raw)
    if C % H != 0:
        raise RefError("channels %d not divisible by heads %d" % (C, H))
    if args.seq_len > maxT:
        raise RefError("--seq-len %d exceeds wpe rows %d" % (args.seq_len, maxT))
    train(args, raw, names, V, lambda params, idx: forward(params, prefix, L, H, idx), "torch_gpt2",
          {"L": L, "C": C, "H": H, "maxT": maxT})


def train(args, raw, names, V, model, tool, shape_meta=None):
    """Trains the parameters `names` of `raw` with model(params, idx) -> logits [B, T, V]
    (or (logits, extra): a scalar added to the objective, not to the reported loss) as the
    module docstring's Data and Optimizer sections say, and writes the outputs."""
    dtype = torch.float64 if args.dtype == "float64" else torch.float32
    out_np = np.float64 if args.dtype == "float64" else np.float32
    B, T, S, A, W = (args.batch, args.seq_len, args.steps, args.grad_accum, args.warmup_steps)
    for flag, val in (("--batch", B), ("--seq-len", T), ("--steps", S), ("--grad-accum", A)):
        if val < 1:
            raise RefError("%s must be >= 1, got %d" % (flag, val))
    if W < 0:
        raise RefError("--warmup-steps must be >= 0, got %d" % W)

    tokens = read_tokens(args.tokens)
    G = B * A
    E = (len(tokens) - 1) // (G * T)
    if E < 1:
        raise RefError("token file has %d tokens, need at least %d (G*T+1)"
                       % (len(tokens), G * T + 1))
    used = tokens[:E * G * T + 1]  # every token any step can read
    if used.max() >= V:
        raise RefError("token id %d out of range for vocab size %d" % (used.max(), V))

    torch.set_default_dtype(dtype)
    params = {n: torch.tensor(raw[n], dtype=dtype).requires_grad_(True) for n in names}
    decay = [params[n] for n in names if params[n].dim() >= 2]
    no_decay = [params[n] for n in names if params[n].dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr, betas=(args.beta1, args.beta2), eps=args.eps,
        weight_decay=args.weight_decay)
    plist = [params[n] for n in names]

    tok = torch.from_numpy(tokens)
    losses, norms, lrs = [], [], []
    out = {}
    for s in range(S):
        lr_s = lr_at(s, S, W, args.lr, args.min_lr)
        for group in opt.param_groups:
            group["lr"] = lr_s
        p0 = (s % E) * G * T
        window = tok[p0:p0 + G * T + 1]
        x_all = window[:-1].view(G, T)
        y_all = window[1:].view(G, T)
        opt.zero_grad(set_to_none=False)
        step_loss = 0.0
        for a in range(A):
            xb = x_all[a * B:(a + 1) * B]
            yb = y_all[a * B:(a + 1) * B]
            logits = model(params, xb)
            extra = 0.0  # a model may add terms to the objective (MoE balance losses)
            if isinstance(logits, tuple):
                logits, extra = logits
            if s == 0 and a == 0:
                out["logits"] = logits.detach().numpy().copy()
            loss = F.cross_entropy(logits.reshape(-1, V), yb.reshape(-1))
            step_loss += loss.item()  # the reported loss is the cross-entropy alone
            ((loss + extra) / A).backward()
        losses.append(step_loss / A)
        if s == 0:
            for n in names:
                out["grad." + n] = params[n].grad.detach().numpy().copy()
        if args.grad_clip > 0:
            norm = torch.nn.utils.clip_grad_norm_(plist, args.grad_clip)
        else:
            norm = torch.norm(torch.stack([q.grad.detach().norm(2) for q in plist]), 2)
        norms.append(float(norm))
        lrs.append(lr_s)
        if not math.isfinite(losses[-1]):
            raise RefError("non-finite loss %r at step %d" % (losses[-1], s))
        opt.step()

    out["loss"] = np.array(losses)
    out["grad_norm"] = np.array(norms)
    out["lr"] = np.array(lrs)
    for n in names:
        out["final." + n] = params[n].detach().numpy().copy()

    meta = dict(shape_meta or {})
    meta.update({"generator": "tests/reference/%s.py" % tool, "torch": torch.__version__,
                 "dtype": args.dtype, "V": V, "B": B, "T": T, "S": S, "A": A, "lr": args.lr,
                 "min_lr": args.min_lr, "warmup_steps": W, "weight_decay": args.weight_decay,
                 "beta1": args.beta1, "beta2": args.beta2, "eps": args.eps,
                 "grad_clip": args.grad_clip, "epoch_windows": E})
    write_safetensors(args.out, out, out_np, meta)
    print("%s: V=%d B=%d T=%d A=%d steps=%d dtype=%s loss %.6f -> %.6f, wrote %s"
          % (tool, V, B, T, A, S, args.dtype, losses[0], losses[-1], args.out))


def run_reporting_errors(run_fn, args, tool):
    """run_fn(args); any failure becomes one "TOOL: error: ..." line and exit status 1."""
    try:
        run_fn(args)
    except RefError as e:
        print("%s: error: %s" % (tool, e), file=sys.stderr)
        return 1
    except Exception as e:  # unexpected failure: still a clear one-line message
        print("%s: error: %s: %s" % (tool, type(e).__name__, e), file=sys.stderr)
        return 1
    return 0


def main(argv=None):
    return run_reporting_errors(run, parse_args(argv), "torch_gpt2.py")


if __name__ == "__main__":
    sys.exit(main())
