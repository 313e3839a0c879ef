# SPDX-License-Identifier: MIT
"""The binding's types: Debian's mypy (python3-mypy) over libclient/python/
kvclient, with the settings of libclient/python/pyproject.toml ([tool.mypy]:
every function annotated, untyped bodies checked too, Python 3.9), and
not an error. Skipped, saying so, where /usr/bin/python3 has no mypy.
"""
from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "libclient" / "python"
PYTHON = "/usr/bin/python3"


def test_mypy_kvclient() -> None:
    have = subprocess.run([PYTHON, "-m", "mypy", "--version"], capture_output=True, text=True)
    if have.returncode != 0:
        pytest.skip(f"{PYTHON} -m mypy: not installed (apt-get install python3-mypy): "
                    f"{(have.stderr or have.stdout).strip()[-200:]}")
    # Its cache in a folder of its own: the source tree stays clean, and a
    # second run in the same make test is quick.
    cache = Path(tempfile.gettempdir()) / f"kvt-mypy-cache-{os.getuid()}"
    r = subprocess.run([PYTHON, "-m", "mypy", "--cache-dir", str(cache),
                        "--config-file", str(PKG / "pyproject.toml")],
                       cwd=PKG, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"mypy kvclient:\n{r.stdout}{r.stderr}"
    assert "Success" in r.stdout, r.stdout
