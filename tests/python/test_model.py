# SPDX-License-Identifier: MIT
"""A PyTorch model across processes: one Python process publishes a
prompt's KV from its paged cache (vLLM's FlashAttention layout), another,
with a different block table, gathers the hits and prefills the rest, and
its logits equal a cold prefill bit for bit for every cached prefix length.
Also runs the examples docs/PYTHON.md quotes (tests/python/test_docs.py
checks the quotes)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import EXAMPLES, ROOT, child_env

pytest.importorskip("torch")

MODEL_PROC = ROOT / "tests" / "python" / "model_proc.py"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], env=child_env(), capture_output=True,
                          text=True, timeout=120)


def test_two_processes_warm_equals_cold(daemon_factory, tmp_path):
    d = daemon_factory("--page-size", "8K")	# 16 x 2 layers x 2 x 2 heads x 16 x 4 B
    ref = str(tmp_path / "logits.pt")
    n = 6
    a = run(str(MODEL_PROC), "publish", "--socket", d.sock, "--ref", ref, "--blocks", str(n))
    assert a.returncode == 0, a.stdout + a.stderr
    assert a.stdout.startswith("publish: hits 0, table [0, 1, 2, 3, 4, 5, 6]")
    assert a.stdout.rstrip().endswith(f"published {n}")
    b = run(str(MODEL_PROC), "check", "--socket", d.sock, "--ref", ref, "--blocks", str(n))
    lines = b.stdout.splitlines()
    want = [f"k={k} hits={k} prefilled={16 * (n - k) + 5} equal=True" for k in range(n + 1)]
    assert lines == want + ["cold prefill equals the publisher's: True"], b.stdout + b.stderr
    assert b.returncode == 0


def test_engine_loop_example(daemon_factory):
    d = daemon_factory("--page-size", "8K")
    out = run(str(EXAMPLES / "engine_loop.py"), "--socket", d.sock)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.splitlines() == [
        "request 0: 69 tokens, 0 of 4 blocks from kvcached, 69 tokens prefilled, logits equal "
        "to a cold prefill: True",
        "request 1: 69 tokens, 3 of 4 blocks from kvcached, 21 tokens prefilled, logits equal "
        "to a cold prefill: True",
        "this client: 2 lookups, 3 blocks hit, 5 published",
    ]


@pytest.mark.parametrize("have", ["numpy", "stdlib"])
def test_tour_example(daemon_factory, tmp_path, have):
    """tour.py runs; with numpy and torch made unimportable it still runs
    its tour (stdlib only, as the docs say: issue #24) and skips PagedKV."""
    d = daemon_factory("--page-size", "8K")
    env = child_env()
    env["KVCACHED_SOCKET"] = d.sock
    if have == "stdlib":
        for mod in ("numpy", "torch"):
            (tmp_path / mod).mkdir()
            (tmp_path / mod / "__init__.py").write_text(
                f"raise ImportError('{mod} hidden by the test')\n")
        env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env["PYTHONPATH"]])
    out = subprocess.run([sys.executable, str(EXAMPLES / "tour.py")], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.splitlines() == [
        "attempt 1: 0 of 5 blocks cached",
        "attempt 2: 5 of 5 blocks cached",
        "gathered 5 blocks: block 3 holds 3.0" if have == "numpy" else
        "PagedKV: skipped (it takes numpy arrays or torch tensors; neither is here)",
    ]
