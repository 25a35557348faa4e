"""Training from Python, and the run folders it leaves."""

import json
import os
import signal
import subprocess
import time
import tomllib
from typing import Callable, Optional

import numpy as np

from . import _meshtrain
from ._flags import flag_args
from .weights import load

StepCallback = Callable[[dict], Optional[bool]]


class TrainResult:
    """What train() saw: `records`, each step's metrics.jsonl record in order; `evals`, each
    validation's; `stopped`, whether on_step asked the run to stop; `run`, the run folder (a
    Run) when `out` was given."""

    def __init__(self, records, evals, stopped, run):
        self.records, self.evals, self.stopped, self.run = records, evals, stopped, run

    @property
    def losses(self):
        return np.array([r["loss"] for r in self.records])

    def __repr__(self):
        return "<TrainResult: %d steps%s%s>" % (len(self.records), ", stopped" if self.stopped else "",
                                                ", run %s" % self.run.path if self.run else "")


def command(name: str, *args: str, **flags):
    """Runs any `meshtrain NAME ARGS... --flag value ...` in this process (prep, export, eval,
    tokenize, ...): its output goes to stdout as in a shell, an error raises MeshtrainError. The
    command's --json result, when it has one, is returned."""
    result, _ = _meshtrain.run_command([name, *map(str, args), *flag_args(**flags)])
    return result


def train(config=None, *, on_step: Optional[StepCallback] = None,
          on_eval: Optional[Callable[[dict], None]] = None, **flags) -> TrainResult:
    """Runs `meshtrain train` with `config` (a TOML file of train's flags, or a dict of them) and
    the keywords as its flags (model="gpt2-124m", steps=100, data="data/brown", out="runs/a",
    tp=2, ...); a keyword wins over the same key of `config`.

    `on_step` gets each step's record, the same dict as its metrics.jsonl line; returning False
    stops the run, which then saves its last step when it has a folder. `on_eval` gets each
    validation's record. A layout on one rank trains in this process and stops at the end of
    the step the callback answered. One on several ranks (tp, pp, dp, cp > 1) runs under
    meshtrain's launcher, with `out` required: its metrics.jsonl carries the steps to the
    callbacks, and a stop is the launcher's SIGTERM, which every rank obeys at the same later
    step boundary (the callback is not called again; `records` has every step that ran)."""
    if isinstance(config, dict):
        flags, config = {**config, **flags}, None
    args = ["train"] + (["--config", str(config)] if config else []) + flag_args(**flags)
    records, evals = [], []
    stopped = [False]

    def step(record):
        records.append(record)
        if on_step is not None and not stopped[0] and on_step(record) is False:
            stopped[0] = True
        return not stopped[0]

    def evaluated(record):
        evals.append(record)
        if on_eval is not None:
            on_eval(record)

    _, ranks = _meshtrain.run_command(args, step, evaluated)
    out = flags.get("out")
    if ranks > 0:
        if not out:
            raise _meshtrain.MeshtrainError(
                "a run on %d ranks needs out=...: the ranks' metrics.jsonl carries its steps here" % ranks)
        _launch(args, out, step, evaluated)
    return TrainResult(records, evals, stopped[0], Run(out) if out else None)


def _launch(args, out, step, evaluated):
    """The run on several ranks: meshtrain's launcher starts them; each new metrics.jsonl line
    goes to the callbacks, and a step answered False sends the launcher SIGTERM (every rank
    stops at the same step and, as --save-on-exit's default says, saves it). Ctrl-C here is
    SIGINT there."""
    metrics = os.path.join(out, "metrics.jsonl")
    seen = len(_lines(metrics))  # a resumed run's earlier lines are not news
    proc = subprocess.Popen([_meshtrain.binary] + args)
    try:
        stopping = False
        while True:
            done = proc.poll() is not None
            lines = _lines(metrics)
            for line in lines[seen:]:
                record = json.loads(line)
                if "val_loss" in record:
                    evaluated(record)
                elif "loss" in record and not step(record) and not stopping:
                    proc.send_signal(signal.SIGTERM)
                    stopping = True
            seen = len(lines)
            if done:
                break
            time.sleep(0.1)
    except BaseException:
        proc.send_signal(signal.SIGINT)
        proc.wait()
        raise
    # Stopped on request: the launcher reports the signal's code (143), which is no failure.
    if proc.returncode != 0 and not (stopping and proc.returncode == 128 + signal.SIGTERM):
        raise _meshtrain.MeshtrainError("meshtrain train on several ranks failed (exit code %d; its error is "
                                        "above)" % proc.returncode)


def _lines(path):
    """The complete lines of a file (a line still being written is left for the next read)."""
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        return []
    return text.split("\n")[:-1]


class Run:
    """A run folder (`train --out`): its config, its metrics as NumPy columns, its checkpoints."""

    def __init__(self, path: str):
        if not os.path.isdir(path):
            raise _meshtrain.MeshtrainError("%s is not a run folder" % path)
        self.path = str(path)

    @property
    def config(self) -> dict:
        """The run's flags as it ran them (config.toml)."""
        with open(os.path.join(self.path, "config.toml"), "rb") as f:
            return tomllib.load(f)

    def records(self):
        """Every metrics.jsonl record, in order."""
        return [json.loads(l) for l in _lines(os.path.join(self.path, "metrics.jsonl")) if l.strip()]

    @property
    def metrics(self) -> dict:
        """The steps' numeric fields as columns: {"step": array, "loss": array, ...}."""
        return _columns([r for r in self.records() if "loss" in r and "val_loss" not in r])

    @property
    def evals(self) -> dict:
        """The validations' fields as columns: {"step", "val_loss", "tokens"}."""
        return _columns([r for r in self.records() if "val_loss" in r])

    @property
    def checkpoints(self):
        """The checkpoint folders, oldest first."""
        root = os.path.join(self.path, "checkpoints")
        if not os.path.isdir(root):
            return []
        names = sorted(n for n in os.listdir(root) if n.startswith("step_") and not n.endswith(".tmp"))
        return [os.path.join(root, n) for n in names]

    def load(self, checkpoint: Optional[str] = None):
        """The weights of a checkpoint (default: the newest) as load() returns them."""
        return load(checkpoint or self.path)

    def model(self, tokenizer: str = ""):
        """The newest checkpoint as a Model (the run's tokenizer copy with it)."""
        return _meshtrain.Model(self.path, tokenizer)

    def __repr__(self):
        return "<meshtrain.Run %s>" % self.path


def _columns(records):
    keys = [k for k in (records[0] if records else {}) if isinstance(records[0][k], (int, float))]
    return {k: np.array([r.get(k, np.nan) for r in records]) for k in keys}
