"""meshtrain.train: a run in this process or through the launcher, each step's record to a
callback that may stop it; meshtrain.Run reads what it left."""

import json
import os

import numpy as np
import pytest

import meshtrain
from conftest import TINY


def test_a_callback_sees_every_step_and_stops_the_run(tmp_path, corpus):
    out = str(tmp_path / "run")
    seen = []

    def on_step(record):
        seen.append(record["step"])
        return record["step"] < 3  # False at step 3: stop there

    result = meshtrain.train(data=corpus, steps=10, out=out, on_step=on_step, **TINY)
    assert seen == [1, 2, 3] and result.stopped and len(result.records) == 3
    assert np.all(np.isfinite(result.losses))
    run = meshtrain.Run(out)
    lines = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
    assert [r["step"] for r in lines if "loss" in r] == [1, 2, 3]
    assert result.records == [r for r in lines if "loss" in r]  # the same records as metrics.jsonl
    assert list(run.metrics["step"]) == [1, 2, 3]
    assert np.array_equal(run.metrics["loss"], result.losses.astype(run.metrics["loss"].dtype))
    assert run.checkpoints and run.checkpoints[-1].endswith("step_00000003")
    assert run.config["steps"] == 10


def test_a_callbacks_exception_ends_the_run_and_is_raised(tmp_path, corpus):
    def on_step(record):
        raise KeyError("from the callback")

    with pytest.raises(KeyError, match="from the callback"):
        meshtrain.train(data=corpus, steps=5, on_step=on_step, **TINY)


def test_several_ranks_run_through_the_launcher(tmp_path, corpus):
    out = str(tmp_path / "dp2")
    seen = []

    def on_step(record):
        seen.append(record["step"])
        return record["step"] < 2

    result = meshtrain.train(data=corpus, steps=20, out=out, dp=2, on_step=on_step, **TINY)
    assert seen == [1, 2] and result.stopped
    # The ranks stop together at a step boundary after the signal, and save that step.
    steps = [r["step"] for r in result.records]
    assert steps == list(range(1, len(steps) + 1)) and 2 <= len(steps) < 20
    assert list(result.run.metrics["step"]) == steps
    assert result.run.checkpoints[-1].endswith("step_%08d" % steps[-1])


def test_errors_are_the_command_lines(tmp_path, corpus):
    with pytest.raises(meshtrain.MeshtrainError, match="did you mean '--steps'"):
        meshtrain.train(data=corpus, step=10, **TINY)
    with pytest.raises(meshtrain.MeshtrainError, match="heads"):
        meshtrain.train(data=corpus, steps=2, heads=5, **TINY)
    with pytest.raises(meshtrain.MeshtrainError, match="needs out="):
        meshtrain.train(data=corpus, steps=2, dp=2, **TINY)
    with pytest.raises(meshtrain.MeshtrainError):
        meshtrain.train(data=str(tmp_path / "no-such-data"), steps=2, **TINY)
    # The process is fine afterwards: a run trains, from a dict or a TOML file of flags.
    assert len(meshtrain.train({**TINY, "data": corpus, "steps": 1}).records) == 1
    toml = tmp_path / "run.toml"
    toml.write_text('model = "tiny"\nsteps = 3\nmicro_batch = 2\nseq_len = 32\nthreads = 1\nquiet = true\n')
    assert len(meshtrain.train(str(toml), data=corpus, steps=2).records) == 2  # the keyword wins


def test_ctrl_c_stops_a_run_in_this_process(corpus):
    """SIGINT (Ctrl-C) while a run trains here: the run stops at the end of that step and the
    interpreter gets its KeyboardInterrupt, as anywhere else in Python."""
    import signal
    import threading

    steps = []
    timer = threading.Timer(1.0, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            meshtrain.train(data=corpus, steps=100000, on_step=lambda r: steps.append(r["step"]), **TINY)
    finally:
        timer.cancel()
    assert 0 < len(steps) < 100000
