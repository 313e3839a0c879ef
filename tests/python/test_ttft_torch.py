# SPDX-License-Identifier: MIT
"""tools/bench/ttft_torch.py, the GPU time-to-first-token benchmark (issue
#32), where no GPU is: its --smoke mode runs the same code on a tiny
Llama-shaped model on the CPU against a real host-pool kvcached it starts
itself, through kvclient.vllm as vLLM calls it, and checks what the GPU
run checks: the warm request matched every full block but the last
token's, its prefix K and V equal the cold prefill's bit for bit, its
first-token logits those of the cold prefill (within rounding), no load
errors, and the daemon stopped cleanly. Without a GPU the full run says
why it skipped."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import BUILD, ROOT, child_env

pytest.importorskip("torch")
TOOL = ROOT / "tools" / "bench" / "ttft_torch.py"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(TOOL), "--kvcached", str(BUILD / "kvcached"),
                           *args], env=child_env(BUILD=str(BUILD)), capture_output=True,
                          text=True, timeout=300)


@pytest.mark.parametrize("copy", ["auto", "layers"])
def test_smoke(copy):
    r = run("--smoke", "--json", "--copy", copy)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [json.loads(x) for x in r.stdout.splitlines()]
    assert [(x["pool"], x["tokens"], x["matched"]) for x in rows] == [("host", 100, 96),
                                                                      ("host", 37, 32)]
    for x in rows:
        assert x["kv_equal"] and x["logits_close"] and x["load_errors"] == 0, x
        assert x["saved_before"] == 0 and x["copy"] == copy
        assert x["cold_ms"] > 0 and x["warm_ms"] > 0


def test_full_run_skips_without_a_gpu():
    import torch
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the full run is a benchmark, not a test")
    r = run("--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"bench": "ttft-torch",
                                    "skipped": "no GPU: torch.cuda.is_available() is False"}
