# SPDX-License-Identifier: MIT
"""What a user sees of kvcached in Python (issue #38): the daemon's warning
at a successful open (Client.warning, a kvclient.KvcWarning, and a line of
the engine's log through the adapters); the adapters' log of kvcached's
state, one line per change with the count of calls that went on without
it, never one per retry; the namespace name both adapters give a model;
and vLLM's older two-argument connector base class."""
from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
import warnings
from types import SimpleNamespace

import pytest

from conftest import BUILD, EXAMPLES, ROOT, Daemon, can_connect, child_env, wait_for

STUBS = ROOT / "tests" / "python" / "stubs"
LOGGERS = ("vllm.kvclient", "kvclient.sglang", "kvclient.engines")


def stubs_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(STUBS))
    monkeypatch.syspath_prepend(str(EXAMPLES))


def lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name in LOGGERS]


def test_open_warning(daemon_factory):
    """A model that fills 8 KiB of each 64 KiB page opens with the daemon's
    warning in Client.warning and as a KvcWarning (warn=False: the
    attribute only); a model that fits has none."""
    import kvclient
    d = daemon_factory("--page-size", "64K", "--pool-size", "1M")
    m = kvclient.Model("kvt-warn", "float16", layers=2, kv_heads=2, head_dim=32,
                       block_tokens=16)
    with pytest.warns(kvclient.KvcWarning, match="fills 8 KiB of each 64 KiB pool page"):
        c = kvclient.Client(m, socket=d.sock)
    assert "fills 8 KiB of each 64 KiB pool page (12.5%)" in c.warning
    c.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with kvclient.Client(m, socket=d.sock, warn=False) as c:
            assert "fills 8 KiB" in c.warning
        big = kvclient.Model("kvt-fits", "float16", layers=16, kv_heads=2, head_dim=32,
                             block_tokens=16)
        with kvclient.Client(big, socket=d.sock) as c:
            assert c.warning is None


class FakeClock:
    """kvclient._engine's clock, driven by the test: 10 s of calls without
    10 s of waiting."""

    def __init__(self):
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def vllm_scheduler(sock: str, **extra):
    from kvclient.vllm import KvcachedConnector
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
    from vllm_proc import vllm_config
    from engine_loop import TinyLlama
    cfg = vllm_config(TinyLlama(), "m", sock, 16, 16)
    cfg.kv_transfer_config.kv_connector_extra_config.update(extra)
    return KvcachedConnector(cfg, KVConnectorRole.SCHEDULER), cfg


def sglang_storage(sock: str, **extra):
    import torch
    from kvclient.sglang import KvcachedStorage
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
    cfg = HiCacheStorageConfig(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0,
                               attn_cp_size=1, is_mla_model=False, enable_storage_metrics=False,
                               is_page_first_layout=False, model_name="sg",
                               extra_config={"socket": sock, **extra})
    L, P, H, D, N = 2, 16, 2, 16, 4
    pool = SimpleNamespace(layout="layer_first", page_size=P, layer_num=L, head_num=H,
                           head_dim=D, dtype=torch.float16, size=N * P,
                           kv_buffer=torch.zeros(2, L, N * P, H, D, dtype=torch.float16))
    st = KvcachedStorage(cfg)
    return st, pool


def start_at(d: Daemon, page: str) -> None:
    """(Re)start d's kvcached on d's socket path, with pages of page bytes."""
    with open(d.log, "ab") as log:
        d.proc = subprocess.Popen([str(BUILD / "kvcached"), "--socket", d.sock, *Daemon.BASE,
                                   "--page-size", page],
                                  stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    wait_for(lambda: can_connect(d.sock), "kvcached listening")


def kill(d: Daemon) -> None:
    d.proc.kill()
    d.proc.wait(timeout=30)
    if os.path.exists(d.sock):
        os.unlink(d.sock)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_adapter_logs_state_changes_once(daemon_factory, monkeypatch, caplog, engine):
    """An engine calling 100 times a second: 10 s against a dead daemon log
    one line (unreachable, and why), not one per retry; the daemon coming
    back logs one line with the count of calls that went on without it;
    the daemon killed logs one line, and the 10 s after it none. The
    engine's clock is driven: no 10 s of waiting."""
    pytest.importorskip("torch")
    stubs_on_path(monkeypatch)
    import kvclient._engine as eng
    clock = FakeClock()
    monkeypatch.setattr(eng, "clock", clock)
    d = daemon_factory()
    kill(d)			# its socket path, with nothing there
    if engine == "vllm":
        a, _ = vllm_scheduler(d.sock)
        req = SimpleNamespace(request_id="r", prompt_token_ids=list(range(80)),
                              cache_salt=None, lora_request=None)

        def call():
            return a.get_num_new_matched_tokens(req, 0)[0]
    else:
        a, pool = sglang_storage(d.sock)

        def call():
            return a.batch_exists(["k0", "k1"])
    caplog.set_level(logging.DEBUG)

    def run(seconds: int) -> None:
        for _ in range(seconds * 100):
            assert call() == 0
            clock.t += 0.01

    if engine == "sglang":
        a.register_mem_pool_host(pool)	# its first open: one call without kvcached
    run(10)
    got = lines(caplog)
    assert len(got) == 1, got
    assert f"kvcached unreachable: attach to kvcached: no kvcached socket at {d.sock}" \
        in got[0] and got[0].endswith("going on without it"), got
    calls = 1001 if engine == "sglang" else 1000
    caplog.clear()
    start_at(d, "8K" if engine == "vllm" else "4K")	# the model's page: no warning
    run(2)
    got = lines(caplog)
    assert len(got) == 1, got
    # Every call so far, and those until the next retry (at most 1 s).
    m = re.search(r"kvcached at (\S+) back \((\d+) calls went on without kvcached in "
                  r"(\d+) s\)$", got[0])
    assert m, got
    assert m[1] == d.sock and calls <= int(m[2]) <= calls + 100 and m[3] in ("10", "11"), got
    caplog.clear()
    kill(d)
    run(10)
    got = lines(caplog)
    assert len(got) == 1, got
    assert f"kvcached at {d.sock} lost" in got[0], got


def test_adapter_refusal_logged_once(daemon, monkeypatch, caplog):
    """A daemon that refuses the model (other block tokens): one error line
    with the daemon's reason, however many calls follow."""
    pytest.importorskip("torch")
    stubs_on_path(monkeypatch)
    import kvclient._engine as eng
    clock = FakeClock()
    monkeypatch.setattr(eng, "clock", clock)
    from kvclient.vllm import KvcachedConnector
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
    from vllm_proc import vllm_config
    from engine_loop import TinyLlama
    s = KvcachedConnector(vllm_config(TinyLlama(block_tokens=32), "m", daemon.sock, 32, 32),
                          KVConnectorRole.SCHEDULER)
    req = SimpleNamespace(request_id="r", prompt_token_ids=list(range(80)), cache_salt=None,
                          lora_request=None)
    caplog.set_level(logging.DEBUG)
    for _ in range(500):
        assert s.get_num_new_matched_tokens(req, 0) == (0, False)
        clock.t += 0.02
    got = lines(caplog)
    assert len(got) == 1, got
    assert "kvcached refuses 'm/float32'" in got[0]
    assert "32-token blocks" in got[0]
    assert caplog.records[-1].levelno == logging.ERROR


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_adapter_logs_open_warning(daemon_factory, monkeypatch, caplog, engine):
    """The daemon's open-time warning reaches the engine's log (the
    adapter's logger: vllm.kvclient, under vLLM's own), once, and not
    Python's warnings."""
    pytest.importorskip("torch")
    stubs_on_path(monkeypatch)
    d = daemon_factory("--page-size", "64K", "--pool-size", "1M")
    caplog.set_level(logging.DEBUG)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        if engine == "vllm":
            a, _ = vllm_scheduler(d.sock)
            req = SimpleNamespace(request_id="r", prompt_token_ids=list(range(80)),
                                  cache_salt=None, lora_request=None)
            for _ in range(3):
                a.get_num_new_matched_tokens(req, 0)
        else:
            a, pool = sglang_storage(d.sock)
            a.register_mem_pool_host(pool)
            for _ in range(3):
                a.batch_exists(["k"])
    got = lines(caplog)
    assert len(got) == 1, got
    want = "8 KiB of each 64 KiB pool page (12.5%)" if engine == "vllm" else \
        "4 KiB of each 64 KiB pool page (6.2%)"
    assert f"kvcached: model {a.model.name if engine == 'vllm' else 'sg/float16'} fills {want}" \
        in got[0], got
    logger = "vllm.kvclient" if engine == "vllm" else "kvclient.sglang"
    assert [r.name for r in caplog.records if r.name in LOGGERS] == [logger]


def test_model_name_means_the_same_in_both(monkeypatch):
    """model_name in the extra config names the model in both adapters; the
    KV dtype follows it after "/" in both; vLLM's default is the model and
    its revision."""
    pytest.importorskip("torch")
    stubs_on_path(monkeypatch)
    s, cfg = vllm_scheduler("/nonexistent/kv.sock", model_name="team/llama")
    assert s.model.name == "team/llama/float32"
    cfg.kv_transfer_config.kv_connector_extra_config.pop("model_name")
    cfg.model_config.revision = "main"
    from kvclient.vllm import KvcachedConnector
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
    assert KvcachedConnector(cfg, KVConnectorRole.SCHEDULER).model.name == "m@main/float32"
    st, pool = sglang_storage("/nonexistent/kv.sock", model_name="team/llama")
    st.register_mem_pool_host(pool)
    assert st._rc.model.name == "team/llama/float16"
    st, pool = sglang_storage("/nonexistent/kv.sock")
    st.register_mem_pool_host(pool)
    assert st._rc.model.name == "sg/float16"
    long = "x" * 80
    from kvclient._engine import namespace_name
    n = namespace_name(long, "float16")
    assert len(n.encode()) == 63 and n.startswith("x" * 50 + "~")


OLD_BASE = '''
class KVConnectorBase_V1(ABC):
    def __init__(self, vllm_config, role: KVConnectorRole):
        self._connector_metadata = None
        self._vllm_config = vllm_config
        self._kv_transfer_config = vllm_config.kv_transfer_config
        self._role = role
'''

CHECK = '''
import sys
from kvclient.vllm import KvcachedConnector
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm_proc import vllm_config
from engine_loop import TinyLlama
cfg = vllm_config(TinyLlama(), "m", "/nonexistent/kv.sock", 16, 16)
for role in (KVConnectorRole.SCHEDULER, KVConnectorRole.WORKER):
    c = KvcachedConnector(cfg, role)	# as an older vLLM's factory builds it
    print(c.role.name, c.model.name, getattr(c, "_kv_cache_config", "absent"))
if sys.argv[1] == "new":
    c = KvcachedConnector(cfg, KVConnectorRole.WORKER, "KVCC")
    print(c.role.name, c._kv_cache_config)
'''


def test_vllm_older_two_argument_base(tmp_path):
    """Against a base class whose constructor takes (vllm_config, role), as
    vLLM's did before kv_cache_config, the connector is built with two
    arguments and passes two; against today's it passes three."""
    pytest.importorskip("torch")
    old = tmp_path / "stubs"
    shutil.copytree(STUBS, old)
    base = old / "vllm/distributed/kv_transfer/kv_connector/v1/base.py"
    text = base.read_text()
    start = text.index("class KVConnectorBase_V1(ABC):")
    end = text.index("    @property")
    base.write_text(text[:start] + OLD_BASE.lstrip("\n") + "\n" + text[end:])
    for stubs, how, want in ((old, "old", "absent"), (STUBS, "new", "None")):
        env = child_env()
        env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], str(stubs)])
        out = subprocess.run([sys.executable, "-c", CHECK, how], env=env, capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        want_lines = [f"SCHEDULER m/float32 {want}", f"WORKER m/float32 {want}"]
        if how == "new":
            want_lines.append("WORKER KVCC")
        assert out.stdout.splitlines() == want_lines, out.stdout + out.stderr
