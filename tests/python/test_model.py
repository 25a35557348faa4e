"""meshtrain.Model: logits against the PyTorch reference (tests/reference/torch_gpt2.py) within
the engine's own parity bound, and generate() against `meshtrain generate`."""

import os
import sys

import numpy as np
import pytest

import meshtrain
from conftest import GPT2_DIR, ROOT, cli

sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))


def test_logits_equal_pytorchs(tiny_run):
    torch = pytest.importorskip("torch")
    import torch_gpt2

    w = meshtrain.load(tiny_run)
    c = w.config
    rng = np.random.default_rng(0)
    ids = rng.integers(0, c["vocab"], size=(2, 24))
    ours = meshtrain.Model(tiny_run).logits(ids)
    assert ours.shape == (2, 24, c["vocab"]) and ours.dtype == np.float32
    params = {k: torch.tensor(v, dtype=torch.float64) for k, v in w.items()}
    prefix, _, L, V, _, _ = torch_gpt2.collect_params(params)
    assert (prefix, L, V) == ("", c["layers"], c["vocab"])
    with torch.no_grad():
        ref = torch_gpt2.forward(params, prefix, L, c["heads"], torch.tensor(ids)).numpy()
    # The bound test_torch_parity.cc holds the engine's logits to (relative L2 error).
    assert np.linalg.norm(ours - ref) / np.linalg.norm(ref) < 1e-4
    # One row alone: the same logits as in the batch, bit for bit.
    assert np.array_equal(meshtrain.Model(tiny_run).logits(ids[1]), ours[1])


def test_generate_equals_the_command_line(tiny_run):
    m = meshtrain.Model(tiny_run, tokenizer=GPT2_DIR)
    text = m.generate("The jury said", max_tokens=12, seed=7)
    code, out, err = cli("generate", "--checkpoint", tiny_run, "--tokenizer", GPT2_DIR, "--prompt", "The jury said",
                         "--max-new-tokens", "12", "--seed", "7")
    assert code == 0, err
    assert out == "The jury said" + text + "\n"
    assert m.generate("The jury said", max_tokens=12, seed=7) == text
    assert m.tokenizer.vocab_size == 50257


def test_bad_input_raises(tiny_run):
    m = meshtrain.Model(tiny_run)
    V, T = m.config["vocab"], m.config["max_seq_len"]
    with pytest.raises(meshtrain.MeshtrainError, match="outside the model's vocabulary"):
        m.logits([1, V])
    with pytest.raises(meshtrain.MeshtrainError, match="context"):
        m.logits(np.zeros(T + 1, dtype=np.int64))
    with pytest.raises(meshtrain.MeshtrainError, match="exceeds the model's context of %d tokens" % T):
        m.generate("Hello", max_tokens=T + 1)
    with pytest.raises(meshtrain.MeshtrainError, match="no-such"):
        meshtrain.Model(tiny_run, tokenizer="/no-such/tokenizer.json")
    with pytest.raises(meshtrain.MeshtrainError, match="top_p"):
        meshtrain.Model(tiny_run, tokenizer=GPT2_DIR).generate("Hello", top_p=0)


def test_llama_logits_equal_pytorchs(tmp_path, corpus):
    """A Llama-shaped model (RMSNorm, RoPE, GQA, SwiGLU) against tests/reference/torch_llama.py,
    fed the arrays load() gives and the config.json save() writes."""
    torch = pytest.importorskip("torch")
    import json

    import torch_llama
    from conftest import TINY

    run = str(tmp_path / "llama")
    meshtrain.train(data=corpus, steps=2, out=run, **{**TINY, "model": "llama-tiny"})
    w = meshtrain.load(run)
    assert "model.layers.0.self_attn.q_proj.weight" in w
    meshtrain.save(w, str(tmp_path / "hf"))
    cfg = json.load(open(tmp_path / "hf" / "config.json"))
    ids = np.random.default_rng(1).integers(0, w.config["vocab"], size=(2, 20))
    ours = meshtrain.Model(run).logits(ids)
    params = {k: torch.tensor(v, dtype=torch.float64) for k, v in w.items()}
    with torch.no_grad():
        ref = torch_llama.forward(params, cfg, torch.tensor(ids)).numpy()
    assert np.linalg.norm(ours - ref) / np.linalg.norm(ref) < 1e-4
