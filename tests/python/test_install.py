# SPDX-License-Identifier: MIT
"""`python3 -m pip install libclient/python` in a fresh virtual environment,
as vLLM and SGLang users install things (issue #24): offline (nothing is
downloaded: the build backend is in the tree and requires nothing), with
dist-info whose version is kvclient.h's, the library carried in the
package, a real lookup against a real daemon from the venv's Python with
neither $KVCLIENT_LIB nor $PYTHONPATH set, and `pip uninstall`."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from conftest import BUILD, PKG, ROOT

CHECK = r"""
import importlib.metadata, os, sys
import kvclient
site, want, sock = sys.argv[1:4]
assert kvclient.__file__.startswith(site), kvclient.__file__
print("metadata", importlib.metadata.version("kvclient"))
print("package", kvclient.__version__)
print("library", kvclient.version())
assert kvclient.library_path() == os.path.join(site, "kvclient", "libkvclient.so.0"), \
    kvclient.library_path()
from kvclient import _lib
f = _lib.fast()
print("fast", f is not None and os.path.dirname(f.__file__) == os.path.join(site, "kvclient"))
m = kvclient.Model("kvt-venv", "float16", layers=1, kv_heads=2, head_dim=32, block_tokens=16)
with kvclient.Client(m, socket=sock) as c:
    ids = list(range(1000, 1000 + 3 * 16))
    for _ in (1, 2):
        with c.request(ids) as r:
            hits = r.lookup()
            if hits < r.blocks:
                r.alloc()
                r.publish()
            print("hits", hits, "of", r.blocks)
"""


def header_version() -> str:
    h = (ROOT / "libclient" / "kvclient.h").read_text()
    return ".".join(re.search(r"^#define KVC_VERSION_%s (\d+)$" % p, h, re.M).group(1)
                    for p in ("MAJOR", "MINOR", "PATCH"))


def clean_env(**extra) -> dict:
    """No $KVCLIENT_LIB, $PYTHONPATH or pip configuration from outside."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("KVCLIENT_LIB", "PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")
           and not k.startswith("PIP_")}
    env.update(PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1", PYTHONDONTWRITEBYTECODE="1")
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    d = tmp_path_factory.mktemp("venv") / "env"
    out = subprocess.run([sys.executable, "-m", "venv", str(d)], capture_output=True,
                         text=True, timeout=300, env=clean_env())
    if out.returncode:
        pytest.skip(f"{sys.executable} -m venv failed (python3-venv missing? "
                    f"tools/install-deps installs it): {out.stderr.strip()[-300:]}")
    return d


def pip(venv, *args, **env):
    return subprocess.run([str(venv / "bin" / "python"), "-m", "pip", *args],
                          capture_output=True, text=True, timeout=300,
                          env=clean_env(**env), cwd=str(venv.parent))


def test_pip_install_in_a_venv(venv, daemon):
    want = header_version()
    # --no-index: a build that tried to download anything fails here.
    out = pip(venv, "install", "--no-index", "--no-cache-dir", str(PKG),
              KVCLIENT_LIB=str(BUILD / "libkvclient.so"))
    assert out.returncode == 0, out.stdout + out.stderr
    py = venv / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_path('platlib'))"],
                          capture_output=True, text=True, env=clean_env()).stdout.strip()
    assert site.startswith(str(venv)), site
    # From another folder, with nothing pointing at the source tree.
    out = subprocess.run([str(py), "-c", CHECK, site, want, daemon.sock], capture_output=True,
                         text=True, timeout=120, env=clean_env(), cwd=str(venv.parent))
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.splitlines() == [
        f"metadata {want}", f"package {want}", f"library {want}",
        # The fast path travels in the wheel when make built it.
        f"fast {bool(list(BUILD.glob('_kvcfast*.so')))}",
        "hits 0 of 3", "hits 3 of 3",
    ]
    # pip knows every file it put there: uninstall leaves nothing.
    out = pip(venv, "uninstall", "-y", "kvclient")
    assert out.returncode == 0, out.stdout + out.stderr
    left = [n for n in os.listdir(site) if n.startswith("kvclient")]
    assert left == [], left


def test_pip_install_without_a_library_says_what_to_do(venv):
    out = pip(venv, "install", "--no-index", "--no-cache-dir", str(PKG),
              KVCLIENT_LIB=str(venv / "nonexistent" / "libkvclient.so"))
    assert out.returncode != 0
    text = out.stdout + out.stderr
    assert "build it first (make tools)" in text, text
    # The message alone, not under a traceback (issue #38).
    assert "Traceback" not in text, text
    assert "kvclient: " + str(venv / "nonexistent" / "libkvclient.so") in text, text


def test_backend_version_is_the_header_version():
    """One version: the backend reads kvclient.h and refuses a package whose
    __version__ differs (the wheel's dist-info carries it)."""
    out = subprocess.run([sys.executable, str(PKG / "backend" / "kvclient_backend.py"),
                          "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == header_version()
