"""What the CPU tests of plancache.torch's native extension share: whether it can be built on this machine (a C++
compiler, ninja, Python's headers), with requirements-dev.txt's ninja put on PATH, and its build folder."""

from __future__ import annotations

import os
import shutil
import sysconfig
import tempfile

import pytest

try:  # requirements-dev.txt's ninja: its binary beside the venv's Python, maybe not on PATH
    import ninja

    os.environ["PATH"] = f"{ninja.BIN_DIR}{os.pathsep}{os.environ.get('PATH', '')}"
except ImportError:
    pass

NEEDS_A_BUILD = pytest.mark.skipif(
    shutil.which("c++") is None
    or shutil.which("ninja") is None
    or not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")),
    reason="no C++ compiler, ninja or Python headers on this machine: the native kernels cannot be built here",
)
BUILD_DIR = os.path.join(tempfile.gettempdir(), "plancache-native-tests")
