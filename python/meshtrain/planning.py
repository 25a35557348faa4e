"""The planner from Python: `plan` and `memory` return what `meshtrain plan --json` prints,
computed by the same code in this process; models and clusters are objects to build or change."""

import dataclasses
import os
import tempfile
import tomllib
from typing import Optional, Union

from . import _meshtrain
from ._flags import flag_args


@dataclasses.dataclass
class ModelSpec:
    """A model to plan: a preset (`plan --model`: gpt3-175b, llama3-70b, gpt2-124m, ...) with any
    of its dimensions replaced. None keeps the preset's. `arch` ("gpt2" or "llama") gives the
    model that family's parts on the same shape."""

    preset: str = "gpt3-175b"
    layers: Optional[int] = None
    heads: Optional[int] = None
    dim: Optional[int] = None
    seq_len: Optional[int] = None
    vocab: Optional[int] = None
    kv_heads: Optional[int] = None
    ffn_dim: Optional[int] = None
    arch: Optional[str] = None

    def replace(self, **changes) -> "ModelSpec":
        """A copy with these fields changed."""
        return dataclasses.replace(self, **changes)

    def flags(self):
        fields = dataclasses.asdict(self)
        return flag_args(model=fields.pop("preset"), **fields)


@dataclasses.dataclass
class Cluster:
    """A cluster to plan on, as a cluster file describes it (docs/planning.md lists the fields:
    peak_tflops_bf16, memory_gb, intra_node_gbps, gpus_per_node, ...). `base` names a preset
    whose fields the others replace; `cluster("h100-80g")` gives a preset's own fields."""

    name: str = "custom"
    base: Optional[str] = None
    fields: dict = dataclasses.field(default_factory=dict)

    def replace(self, name: Optional[str] = None, **fields) -> "Cluster":
        """A copy with these fields changed (and a new name when given)."""
        return Cluster(name or self.name, self.base, {**self.fields, **fields})

    def toml(self) -> str:
        lines = ["name = %s" % _toml_value(self.name)]
        if self.base:
            lines.append("base = %s" % _toml_value(self.base))
        tables = []
        for key, value in self.fields.items():
            if isinstance(value, dict):
                tables.append("\n[%s]\n" % key + "".join("%s = %s\n" % (k, _toml_value(v)) for k, v in value.items()))
            else:
                lines.append("%s = %s" % (key, _toml_value(value)))
        return "\n".join(lines) + "\n" + "".join(tables)


def cluster(preset: str) -> Cluster:
    """A built-in cluster (a100-80g, h100-80g, h200) as an object to change."""
    fields = tomllib.loads(_meshtrain.cluster_preset_text(preset))
    name = fields.pop("name", preset)
    base = fields.pop("base", None)
    return Cluster(name, base, fields)


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError("a cluster field must be a number, a string, a bool or a list, not %r" % (value,))


class Plan(dict):
    """`meshtrain plan --json`'s document: "model", "cluster", "gpus", ..., and "layouts", the
    predicted layouts fastest first (those that fit first), each with "layout", "step_s",
    "tokens_per_s", "mfu", "bubble", "comm_s" by axis and "mem_gb" by category."""

    @property
    def layouts(self):
        return self["layouts"]

    @property
    def best(self):
        """The fastest layout that fits (None when none does)."""
        return next((l for l in self["layouts"] if l["fits"]), None)


def plan(model: Union[str, ModelSpec] = "gpt3-175b", cluster: Union[str, Cluster] = "a100-80g",
         gpus: int = 0, global_batch: int = 0, top: int = 10, **fixed) -> Plan:
    """Ranks layouts of `model` on `gpus` GPUs of `cluster` (a preset name, a cluster file's
    path, "local", or a Cluster). Keywords fix what `plan` would search, as its flags do:
    tp=8, pp=4, zero=1, schedule="1f1b", sp=True, precision="fp8"... (`meshtrain plan --help`)."""
    spec = model if isinstance(model, ModelSpec) else ModelSpec(preset=model)
    with _cluster_path(cluster) as path:
        args = ["plan", "--json"] + spec.flags() + flag_args(cluster=path, gpus=gpus or None,
                                                              global_batch=global_batch or None, top=top, **fixed)
        result, _ = _meshtrain.run_command(args)
    return Plan(result)


def memory(params: float, dp=(1, 4, 16, 64, 256, 1024), state: str = "mixed") -> dict:
    """ZeRO's model-state bytes per rank (`plan --memory --json`): for each data-parallel size,
    each stage's params, grads, optimizer state and total in decimal GB. `state` is "mixed"
    (2 + 2 + 12 bytes a parameter) or "fp32" (4 + 4 + 8)."""
    dp = [dp] if isinstance(dp, int) else list(dp)
    result, _ = _meshtrain.run_command(["plan", "--memory", "--json"] + flag_args(params=params, dp=dp, state=state))
    return result


class _cluster_path:
    """A Cluster written to a temporary cluster file for the call; a name or path as it is."""

    def __init__(self, cluster):
        self.cluster, self.path = cluster, None

    def __enter__(self):
        if not isinstance(self.cluster, Cluster):
            return str(self.cluster)
        fd, self.path = tempfile.mkstemp(prefix="meshtrain-cluster-", suffix=".toml")
        with os.fdopen(fd, "w") as f:
            f.write(self.cluster.toml())
        return self.path

    def __exit__(self, *exc):
        if self.path:
            os.unlink(self.path)
