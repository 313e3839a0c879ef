# SPDX-License-Identifier: MIT
"""The engine adapters: kvclient.vllm (a vLLM v1 KV connector) and
kvclient.sglang (an SGLang HiCache storage backend), each driven in real
engine processes against a real kvcached, with the engines' call
sequences (described in vllm_proc.py and sglang_proc.py, from the engines'
documented interfaces) and the stand-ins of tests/python/stubs for the
engine modules the adapters import (vLLM and SGLang cannot be installed
here)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import ROOT, child_env

pytest.importorskip("torch")

HERE = ROOT / "tests" / "python"
STUBS = HERE / "stubs"


def engine(script: str, *args: str) -> subprocess.CompletedProcess:
    env = child_env()
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], str(STUBS)])
    return subprocess.run([sys.executable, str(HERE / script), *args], env=env,
                          capture_output=True, text=True, timeout=180)


@pytest.mark.parametrize("block_size", [16, 32, 8])
def test_vllm_two_engines(daemon_factory, block_size):
    """vLLM block_size equal to kvcached's 16-token blocks, a multiple, a
    divisor: the second engine's connector reports the first's prompt as
    matched, loads it into other block ids, and its logits equal a cold
    prefill's bit for bit."""
    d = daemon_factory("--page-size", "8K")
    a = engine("vllm_proc.py", "prefill", "--socket", d.sock, "--block-size", str(block_size))
    assert a.returncode == 0, a.stdout + a.stderr
    assert a.stdout.splitlines() == ["prefill: matched 0 errors 0 computed from 0 equal True"]
    b = engine("vllm_proc.py", "load", "--socket", d.sock, "--block-size", str(block_size))
    n = 6 * block_size	# 6 vLLM blocks + 5 tokens: every full block but never the last token
    assert b.stdout.splitlines() == [f"load: matched {n} errors 0 computed from {n} equal True"], \
        b.stdout + b.stderr
    assert b.returncode == 0
    ns = {r["model"]: r for r in d.kvstat()["namespaces"]}
    # The namespace: the model's name and its KV dtype (vLLM's "auto").
    assert ns["tinyllama-vllm/float32"]["name"] == "tinyllama-vllm/float32"
    assert ns["tinyllama-vllm/float32"]["hit_blocks"] > 0
    assert ns["tinyllama-vllm/float32"]["keys"] == "tokens"


def test_vllm_block_size_refused(daemon_factory):
    """A vLLM block size neither a multiple nor a divisor of kvcached's
    block tokens is refused with both named."""
    d = daemon_factory("--page-size", "8K")
    b = engine("vllm_proc.py", "prefill", "--socket", d.sock, "--block-size", "24")
    assert b.returncode != 0
    assert "block_size 24 is neither a multiple nor a divisor of kvcached's block tokens 16" \
        in b.stderr


def test_vllm_daemon_killed(daemon_factory):
    """The daemon SIGKILLed between the scheduler's promise and the
    worker's load: the connector reports every promised block as failed
    (get_block_ids_with_load_errors), the engine recomputes them, its
    logits equal a cold prefill's, and nothing raises."""
    d = daemon_factory("--page-size", "8K")
    a = engine("vllm_proc.py", "prefill", "--socket", d.sock)
    assert a.returncode == 0, a.stdout + a.stderr
    b = engine("vllm_proc.py", "kill", "--socket", d.sock, "--daemon-pid", str(d.proc.pid))
    assert b.stdout.splitlines() == ["kill: matched 96 errors 6 computed from 0 equal True"], \
        b.stdout + b.stderr
    assert b.returncode == 0
    assert d.proc.wait(timeout=30) == -9
    # With no daemon at all the connector reports no match.
    c = engine("vllm_proc.py", "load", "--socket", d.sock)
    assert c.stdout.splitlines() == ["load: matched 0 errors 0 computed from 0 equal True"], \
        c.stdout + c.stderr


def test_sglang_two_engines(daemon_factory):
    """One SGLang process backs its host pool's pages up, another
    prefetches them into other host pages: bytes equal; the leading-hit
    count stops at the first missing key; the namespace is engine-keyed,
    apart from a token-keyed one, under the model's name in kvstat."""
    d = daemon_factory()
    a = engine("sglang_proc.py", "set", "--socket", d.sock)
    assert a.stdout.splitlines() == ["set: stored 6 of 6, again 6"], a.stdout + a.stderr
    b = engine("sglang_proc.py", "get", "--socket", d.sock)
    assert b.stdout.splitlines() == [
        "get: exists 6 with a gap at 3: 3, loaded 6, bytes equal True, get() equal True, "
        "exists(missing) False"], b.stdout + b.stderr
    ns = {r["model"]: r for r in d.kvstat()["namespaces"]}
    assert ns["tinyllama-sglang/float16"]["name"] == "tinyllama-sglang/float16 (engine keys)"
    assert ns["tinyllama-sglang/float16"]["pages"] == 6
    assert ns["tinyllama-sglang/float16"]["keys"] == "engine"


def test_engine_keys_never_mix_with_tokens(daemon):
    """An engine-keyed namespace and the token-keyed one of the same model
    are two namespaces: a block of one is never a hit in the other, and
    each kind of request is refused on the other kind of Client."""
    import kvclient
    from conftest import tiny_model, tokens
    toks = tokens(48, 3)
    with kvclient.Client(tiny_model("mix"), socket=daemon.sock) as ct, \
            kvclient.Client(tiny_model("mix", keys="engine"), socket=daemon.sock) as ce:
        with ct.request(toks) as r:
            r.lookup()
            r.alloc()
            assert r.publish() == 3
        with ce.request_keys(["a", "b", "c"]) as r:
            assert r.lookup() == 0
            r.alloc()
            assert r.publish() == 3
        with ce.request_keys(["b", "c"]) as r:	# pages are keyed on their own
            assert r.lookup() == 2
        with ct.request(toks) as r:
            assert r.lookup() == 3
        with pytest.raises(kvclient.InvalidArgumentError, match="use request_keys"):
            ce.request(toks)
        with pytest.raises(kvclient.InvalidArgumentError, match="keys blocks by tokens"):
            ct.request_keys(["a"])
        with pytest.raises(kvclient.TooBigError):
            ce.request_keys(["x" * 1025])
        with pytest.raises(kvclient.InvalidArgumentError):
            ce.request_keys(["", "a"])
    names = sorted(r["name"] for r in daemon.kvstat()["namespaces"])
    assert names == ["mix", "mix (engine keys)"]


def test_engine_keys_single_flight(daemon):
    """A block another client of an engine-keyed namespace is writing is
    reported in flight wherever it sits in the asking request (blocks are
    keyed on their own, their parent is the root), and wait() gets it once
    published."""
    import kvclient
    from conftest import tiny_model
    m = tiny_model("flight", keys="engine")
    with kvclient.Client(m, socket=daemon.sock) as a, kvclient.Client(m, socket=daemon.sock) as b:
        with a.request_keys(["p", "q"]) as ra:
            assert ra.lookup() == 0
            assert ra.alloc() == 2
            with b.request_keys(["q"]) as rb:
                assert rb.lookup() == 0
                assert rb.inflight == 1
            ra.publish()
            with b.request_keys(["q"]) as rb:
                assert rb.lookup() == 1


def test_connected_sees_daemon_exit(daemon_factory):
    """Client.connected() turns False once the daemon is gone, with no
    round trip; a lookup that follows finds the handle dead."""
    import kvclient
    from conftest import tiny_model
    d = daemon_factory()
    c = kvclient.Client(tiny_model(), socket=d.sock)
    assert c.connected()
    d.proc.kill()
    d.proc.wait(timeout=30)
    assert not c.connected()
    with pytest.raises(kvclient.ConnectionLostError):
        with c.request(list(range(16))) as r:
            r.lookup()
    c.close()
