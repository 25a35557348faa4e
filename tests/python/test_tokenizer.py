"""meshtrain.Tokenizer gives the command line's ids (which the engine's tests hold to each
format's reference implementation on the whole Brown corpus) for every format it reads."""

import os

import pytest

import meshtrain
from conftest import GPT2_DIR, ROOT, brown_text, cli

TOKENIZERS = os.path.join(ROOT, "data", "tokenizers")
FORMATS = {
    "gpt2": GPT2_DIR,
    "llama3": os.path.join(TOKENIZERS, "llama3"),
    "llama2": os.path.join(TOKENIZERS, "llama2"),
    "mistral": os.path.join(TOKENIZERS, "mistral"),
    "gpt2-hf": os.path.join(TOKENIZERS, "gpt2-hf"),
    "qwen2-style": os.path.join(TOKENIZERS, "qwen2-style"),
    "cl100k_base": os.path.join(TOKENIZERS, "tiktoken", "cl100k_base.tiktoken"),
    "o200k_base": os.path.join(TOKENIZERS, "tiktoken", "o200k_base.tiktoken"),
    "spm-brown": os.path.join(TOKENIZERS, "spm-brown", "tokenizer.model"),
}
TEXT = brown_text(60_000) + "\n  Unicode: naïve café — 東京 🙂\n"


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_ids_equal_the_command_lines(name):
    tok = meshtrain.Tokenizer(FORMATS[name])
    ids = tok.encode(TEXT)
    code, out, err = cli("tokenize", "--tokenizer", FORMATS[name], stdin=TEXT)
    assert code == 0, err
    assert ids == [int(i) for i in out.split()]
    assert tok.decode(ids) == TEXT
    assert max(ids) < tok.vocab_size


def test_batch_encode_and_special_tokens():
    tok = meshtrain.Tokenizer(FORMATS["llama3"])
    texts = ["The jury said.", "", "Fulton County"]
    assert tok.encode_batch(texts) == [tok.encode(t) for t in texts]
    assert tok.encode("Hi", special=True)[0] == tok.bos_id
    assert tok.token_bytes(tok.encode("The")[0]) == b"The"


def test_errors():
    with pytest.raises(meshtrain.MeshtrainError, match="no-such"):
        meshtrain.Tokenizer("/no-such/tokenizer.json")
    tok = meshtrain.Tokenizer(GPT2_DIR)
    with pytest.raises(meshtrain.MeshtrainError, match="99999999"):
        tok.decode([1, 99999999])
