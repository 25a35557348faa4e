"""docs/python.md's session, run as written: its ```python blocks in order, in one namespace,
in a scratch folder laid out like the repository (data/tokenizers, tests/reference)."""

import contextlib
import io
import os
import re

from conftest import ROOT


def test_the_python_guide_runs(tmp_path):
    text = open(os.path.join(ROOT, "docs", "python.md")).read()
    blocks = re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)
    assert len(blocks) >= 6
    os.makedirs(tmp_path / "data")
    os.makedirs(tmp_path / "tests")
    os.symlink(os.path.join(ROOT, "data", "tokenizers"), tmp_path / "data" / "tokenizers")
    os.symlink(os.path.join(ROOT, "tests", "reference"), tmp_path / "tests" / "reference")
    here = os.getcwd()
    os.chdir(tmp_path)
    out = io.StringIO()
    try:
        namespace = {}
        with contextlib.redirect_stdout(out):
            for block in blocks:
                exec(compile(block, "docs/python.md", "exec"), namespace)
    finally:
        os.chdir(here)
    printed = out.getvalue()
    print(printed)
    # What the guide says the blocks print.
    assert "[120.0, 31.41, 16.64, 1.88]" in printed
    assert "did you mean '--steps'" in printed
    assert os.path.getsize(tmp_path / "memory_by_tp.png") > 0
    result = namespace["result"]
    assert result.stopped and result.records[-1]["loss"] < 10 and all(r["loss"] >= 10 for r in result.records[:-1])
