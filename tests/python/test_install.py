"""`pip install --no-build-isolation .` offline (no index), into a virtual environment that
sees Debian's packages, as docs/python.md says; the installed package then works from
another folder."""

import os
import subprocess
import sys

from conftest import ROOT


def test_pip_installs_the_package_offline(tmp_path):
    venv = tmp_path / "venv"
    subprocess.check_call([sys.executable, "-m", "venv", "--system-site-packages", str(venv)])
    pip = subprocess.run([str(venv / "bin" / "pip"), "install", "--no-build-isolation", "--no-index", "-q", ROOT],
                         capture_output=True, text=True, env={**os.environ, "PIP_NO_CACHE_DIR": "1"})
    assert pip.returncode == 0, pip.stdout + pip.stderr
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    code = ("import meshtrain; print(meshtrain.__file__); "
            "print(meshtrain.memory(1e9, dp=[8])['rows'][0]['stages'][1]['total_gb'])")
    out = subprocess.check_output([str(venv / "bin" / "python"), "-c", code], cwd=tmp_path, env=env, text=True)
    where, total = out.split()
    assert where.startswith(str(venv)) and float(total) == 5.5  # (2 + 2) psi + 12 psi / 8, psi = 1e9
