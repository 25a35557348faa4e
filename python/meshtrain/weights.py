"""A model's weights as NumPy arrays under Hugging Face's names."""

from . import _meshtrain


class Weights(dict):
    """{HF name: float32 array}, in the model's order, with the model's record in `.config`
    (layers, heads, dim, max_seq_len, vocab and the architecture's parts)."""

    def __init__(self, arrays, config):
        super().__init__(arrays)
        self.config = config


def load(path: str) -> Weights:
    """The weights of a run folder (its newest checkpoint) or checkpoint folder of any layout
    (tp, pp, dp, ZeRO shards: the whole model comes back), an HF folder or .safetensors file, or
    an llm.c .bin. GPT-2's are named as HF's GPT2Model ("h.0.attn.c_attn.weight", Conv1D
    weights [in, out]), Llama's as LlamaForCausalLM ("model.layers.0.self_attn.q_proj.weight")."""
    config, arrays = _meshtrain.load_weights(str(path))
    return Weights(arrays, config)


def save(arrays, out: str, config=None, max_shard_gb: float = 5.0) -> None:
    """Writes `arrays` (HF names and shapes, every tensor of the model) as an HF folder
    (config.json and model.safetensors, in shards past max_shard_gb) or, for a path ending in
    .safetensors, that one file; `meshtrain train --init-from`, `generate`, `serve` and
    load() read either. `config` is the model's record (default: `arrays.config`, as load()
    returns it). Arrays of another dtype are converted to float32."""
    if config is None:
        config = getattr(arrays, "config", None)
    if config is None:
        raise _meshtrain.MeshtrainError("save needs the model's record: config=... (load() returns it as .config)")
    _meshtrain.save_weights(dict(arrays), config, str(out), max_shard_gb)
