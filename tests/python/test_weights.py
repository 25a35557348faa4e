"""meshtrain.load / save: weights as arrays under HF names, from a checkpoint of any layout,
and back, bit for bit."""

import numpy as np
import pytest

import meshtrain
from conftest import TINY


def test_round_trip_is_bit_for_bit(tiny_run, tmp_path):
    w = meshtrain.load(tiny_run)
    assert w.config["layers"] > 0 and "wte.weight" in w and "h.0.attn.c_attn.weight" in w
    assert w["wte.weight"].shape == (w.config["vocab"], w.config["dim"])
    assert w["h.0.attn.c_attn.weight"].shape == (w.config["dim"], 3 * w.config["dim"])  # Conv1D: [in, out]
    for out in (tmp_path / "hf", tmp_path / "model.safetensors"):
        meshtrain.save(w, str(out))
        back = meshtrain.load(str(out))
        assert list(back) == list(w)
        for name in w:
            assert back[name].dtype == np.float32 and np.array_equal(back[name], w[name]), name


def test_any_layout_loads_as_one_model(tmp_path, corpus, tiny_run):
    """The same run on two pipeline stages (the launcher's ranks): its checkpoint, stored by
    stage, loads as the whole model, equal to the one-rank run's within the parity bound."""
    out = str(tmp_path / "pp2")
    meshtrain.train(data=corpus, steps=4, out=out, pp=2, **TINY)
    one, two = meshtrain.load(tiny_run), meshtrain.load(out)
    assert list(one) == list(two)
    for name in one:
        np.testing.assert_allclose(two[name], one[name], rtol=0, atol=1e-5, err_msg=name)


def test_save_names_what_is_wrong(tiny_run, tmp_path):
    w = meshtrain.load(tiny_run)
    missing = dict(w)
    del missing["ln_f.weight"]
    with pytest.raises(meshtrain.MeshtrainError, match="ln_f.weight is missing"):
        meshtrain.save(missing, str(tmp_path / "a"), config=w.config)
    bent = dict(w)
    bent["ln_f.bias"] = np.zeros(3, np.float32)
    with pytest.raises(meshtrain.MeshtrainError, match=r"ln_f.bias has shape \[3\]"):
        meshtrain.save(bent, str(tmp_path / "b"), config=w.config)
    extra = dict(w)
    extra["lm_head.extra"] = np.zeros(3, np.float32)
    with pytest.raises(meshtrain.MeshtrainError, match="lm_head.extra is not one of this model's"):
        meshtrain.save(extra, str(tmp_path / "c"), config=w.config)
    with pytest.raises(meshtrain.MeshtrainError, match="config"):
        meshtrain.save(dict(w), str(tmp_path / "d"))
    with pytest.raises(meshtrain.MeshtrainError):
        meshtrain.load(str(tmp_path / "no-such-run"))
