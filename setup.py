"""`pip install --no-build-isolation .`: the Python module, built by CMake into build/ (as
scripts/setup.sh builds it) and installed as the package `meshtrain`. Offline: it needs only
Debian's setuptools and the packages scripts/setup.sh installs. docs/python.md has the details."""

import glob
import os
import shutil
import subprocess
import sys

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

ROOT = os.path.dirname(os.path.abspath(__file__))
BUILD = os.path.join(ROOT, "build")


class BuildWithCMake(build_py):
    """Builds the extension (and the command it launches runs on several ranks with) with this
    interpreter, then adds it to the package."""

    def run(self):
        if not os.path.exists(os.path.join(BUILD, "CMakeCache.txt")):
            subprocess.check_call(["cmake", "-S", ROOT, "-B", BUILD, "-DCMAKE_BUILD_TYPE=Release",
                                   "-DMESHTRAIN_UNITY=ON", "-DPython_EXECUTABLE=" + sys.executable])
        subprocess.check_call(["cmake", "--build", BUILD, "-j", str(os.cpu_count() or 1), "--target",
                               "meshtrain_python", "meshtrain_python_files"])
        super().run()
        target = os.path.join(self.build_lib, "meshtrain")
        for so in glob.glob(os.path.join(BUILD, "python", "meshtrain", "_meshtrain*.so")):
            shutil.copy2(so, target)


class BinaryDistribution(Distribution):
    def has_ext_modules(self):
        return True  # a platform wheel: the extension is built for this machine


setup(
    name="meshtrain",
    version="0.1.0",
    description="meshtrain's planner, tokenizers, checkpoints and training from Python",
    packages=["meshtrain"],
    package_dir={"": "python"},
    package_data={"meshtrain": ["*.pyi", "py.typed"]},
    python_requires=">=3.11",
    install_requires=["numpy"],
    cmdclass={"build_py": BuildWithCMake},
    options={"build": {"build_base": os.path.join("build", "setuptools")}},  # beside CMake's files
    distclass=BinaryDistribution,
)
