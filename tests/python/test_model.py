# SPDX-License-Identifier: MIT
"""A PyTorch model across processes: one Python process publishes a
prompt's KV from its paged cache (vLLM's FlashAttention layout), another,
with a different block table, gathers the hits and prefills the rest, and
its logits equal a cold prefill bit for bit for every cached prefix length.
Also runs the engine loop example of docs/PYTHON.md, which that page
quotes."""
from __future__ import annotations

import re
import subprocess
import sys
import textwrap

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


def test_doc_quotes_the_example():
    """docs/PYTHON.md shows the example's engine loop as it is in the file."""
    src = (EXAMPLES / "engine_loop.py").read_text()
    m = re.search(r"# --8<-- \[start:prefill\]\n(.*?)    # --8<-- \[end:prefill\]\n", src, re.S)
    assert m, "markers around Engine.prefill in engine_loop.py"
    doc = (ROOT / "docs" / "PYTHON.md").read_text()
    assert "```python\n" + textwrap.dedent(m.group(1)) + "```\n" in doc, \
        "docs/PYTHON.md must quote Engine.prefill as it is in engine_loop.py"
