"""meshtrain.plan and meshtrain.memory give `meshtrain plan --json`'s numbers, for models and
clusters built in Python too, and its errors as exceptions."""

import json

import pytest

import meshtrain
from conftest import cli

LLAMA_70B = dict(model="llama3-70b", cluster="h100-80g", gpus=512, global_batch=512, top=5)


def test_plan_equals_the_command_line():
    ours = meshtrain.plan(**LLAMA_70B)
    code, out, err = cli("plan", "--model", "llama3-70b", "--cluster", "h100-80g", "--gpus", "512",
                         "--global-batch", "512", "--top", "5", "--json")
    assert code == 0, err
    assert ours == json.loads(out)
    assert len(ours.layouts) == 5
    best = ours.best
    assert best["fits"] and best["mfu"] > 0 and best["step_s"] > 0
    assert set(best["mem_gb"]) >= {"params", "grads", "optim", "activations", "total"}
    assert set(best["comm_s"]) == {"tp", "cp", "pp", "dp", "ep"}


def test_fixed_choices_are_flags():
    p = meshtrain.plan(**LLAMA_70B, tp=4, zero=1, schedule="1f1b")
    assert p.layouts and all(l["layout"]["tp"] == 4 and l["layout"]["zero"] == 1 for l in p.layouts)


def test_a_model_built_in_python():
    spec = meshtrain.ModelSpec("llama3-70b")
    half = spec.replace(layers=40)
    a = meshtrain.plan(spec, "h100-80g", gpus=64, global_batch=64, top=1)
    b = meshtrain.plan(half, "h100-80g", gpus=64, global_batch=64, top=1)
    assert b["model"]["layers"] == 40 and a["model"]["layers"] == 80
    assert b["model"]["parameters"] < a["model"]["parameters"]
    code, out, _ = cli("plan", "--model", "llama3-70b", "--layers", "40", "--cluster", "h100-80g", "--gpus", "64",
                       "--global-batch", "64", "--top", "1", "--json")
    assert code == 0 and b == json.loads(out)


def test_a_cluster_built_in_python(tmp_path):
    h100 = meshtrain.cluster("h100-80g")
    assert h100.fields["memory_gb"] == 80
    small = h100.replace(name="h100-40g", memory_gb=40)
    p = meshtrain.plan("llama3-8b", small, gpus=16, global_batch=64, top=3)
    assert p["cluster"] == "h100-40g"
    full = meshtrain.plan("llama3-8b", "h100-80g", gpus=16, global_batch=64, top=1).layouts[0]["mem_gb"]["available"]
    assert all(l["mem_gb"]["available"] == pytest.approx(full - 40) for l in p.layouts)  # 40 GB less per GPU
    # The same file given to the command line plans the same.
    path = tmp_path / "small.toml"
    path.write_text(small.toml())
    code, out, _ = cli("plan", "--model", "llama3-8b", "--cluster", str(path), "--gpus", "16", "--global-batch", "64",
                       "--top", "3", "--json")
    assert code == 0 and json.loads(out) == p


def test_memory_is_the_zero_papers_table():
    t = meshtrain.memory(7.5e9, dp=[1, 64])
    assert t["bytes_per_parameter"] == {"params": 2, "grads": 2, "optim": 12}
    one, many = t["rows"]
    assert one["dp"] == 1 and many["dp"] == 64
    assert one["stages"][0]["total_gb"] == pytest.approx(120.0)   # 16 bytes x 7.5e9
    assert many["stages"][1]["total_gb"] == pytest.approx(31.40625)  # (2 + 2) psi + 12 psi / 64
    assert many["stages"][3]["total_gb"] == pytest.approx(1.875)   # 16 psi / 64


def test_errors_are_the_command_lines():
    with pytest.raises(meshtrain.MeshtrainError, match="--gpus must be >= 1"):
        meshtrain.plan("llama3-8b", "h100-80g", gpus=0, global_batch=8)
    with pytest.raises(meshtrain.MeshtrainError, match="did you mean '--tp'"):
        meshtrain.plan("llama3-8b", "h100-80g", gpus=8, global_batch=8, tpp=2)
    with pytest.raises(meshtrain.MeshtrainError, match="no-such-cluster"):
        meshtrain.plan("llama3-8b", "no-such-cluster", gpus=8, global_batch=8)
    with pytest.raises(meshtrain.MeshtrainError, match="--heads"):
        meshtrain.plan(meshtrain.ModelSpec("llama3-8b", heads=7), "h100-80g", gpus=8, global_batch=8)
    with pytest.raises(meshtrain.MeshtrainError):
        meshtrain.cluster("no-such-preset")
