"""meshtrain from Python: plan layouts, tokenize, read and write weights, run models, train.

Everything here runs meshtrain's own engine (the extension module ``meshtrain._meshtrain``),
with the command line's checks and messages: a bad argument raises ``MeshtrainError`` with
the text ``meshtrain ...`` would print. See docs/python.md for a walk-through.

    plan(model, cluster, gpus, global_batch, **fixed)   ranked layouts, as `plan --json`
    memory(params, dp=..., state=...)                   ZeRO's model-state table
    ModelSpec, Cluster                                  models and clusters built in Python
    Tokenizer(path)                                     encode / decode, every format
    load(path) / save(arrays, config, out)              weights as NumPy arrays, HF names
    Model(path)                                         .logits(ids), .generate(prompt)
    train(config=None, on_step=..., **flags)            a training run, with callbacks
    Run(path)                                           a run folder: config, metrics, checkpoints
    command(name, *args, **flags)                       any other command (prep, export, ...)
"""

from ._meshtrain import InternalError, MeshtrainError, Model, Tokenizer
from .planning import Cluster, ModelSpec, Plan, cluster, memory, plan
from .runs import Run, TrainResult, command, train
from .weights import load, save

__all__ = [
    "Cluster", "InternalError", "MeshtrainError", "Model", "ModelSpec", "Plan", "Run", "Tokenizer",
    "TrainResult", "cluster", "command", "load", "memory", "plan", "save", "train",
]
