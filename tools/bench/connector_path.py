#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Where a request's time goes in kvclient.vllm's connector, on the CPU:
Llama-3-8B's layer and block counts (32 layers, 16-token blocks) with a
tiny head (one KV head of 8 dims: 256 bytes a block and layer), so that
the copies cost next to nothing and what is left is the connector's own
Python and C path. A cold request (saves every block) then a warm one
(loads them into other blocks), in vLLM's call order, each stage timed;
medians of --runs after one.

  connector_path.py SOCKET [--tokens 2048,8192] [--copy auto,layers]

against a kvcached with 16 KiB pages (--page-size 16K --pool-size 256M
--max-share 100); run from the tree with KVCLIENT_LIB and PYTHONPATH
(libclient/python, libclient/python/examples, tests/python,
tests/python/stubs) set. docs/BENCHMARKS.md, "GPU engines", has figures.
"""
import argparse
import statistics
import time
from types import SimpleNamespace

import torch

from kvclient.vllm import KvcachedConnector
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm_proc import Blocks, vllm_config

L, H, D, BS = 32, 1, 8, 16


def measure(sock: str, ntok: int, copy: str, runs: int) -> None:
    lm = SimpleNamespace(layers=L, heads=1, kv_heads=H, head_dim=D, block_tokens=BS)
    cfg = vllm_config(lm, f"connector-path-{copy}", sock, BS, BS, copy)
    cfg.model_config.dtype = torch.float16
    sched = KvcachedConnector(cfg, KVConnectorRole.SCHEDULER)
    worker = KvcachedConnector(cfg, KVConnectorRole.WORKER)
    nb = ntok // BS
    caches = [torch.zeros((2, 2 * nb + 2, BS, H, D), dtype=torch.float16) for _ in range(L)]
    names = [f"model.layers.{i}.self_attn.attn" for i in range(L)]
    worker.register_kv_caches(dict(zip(names, caches)))

    def step(rid, prompt, ids):
        req = SimpleNamespace(request_id=rid, prompt_token_ids=prompt, cache_salt=None,
                              lora_request=None, num_computed_tokens=0)
        t = [time.perf_counter()]
        matched, _ = sched.get_num_new_matched_tokens(req, 0)
        t.append(time.perf_counter())
        sched.update_state_after_alloc(req, Blocks(ids), matched)
        out = SimpleNamespace(
            scheduled_new_reqs=[SimpleNamespace(req_id=rid, prompt_token_ids=prompt,
                                                block_ids=(list(ids),),
                                                num_computed_tokens=matched)],
            scheduled_cached_reqs=SimpleNamespace(req_ids=[], new_block_ids=[],
                                                  num_computed_tokens=[],
                                                  resumed_req_ids=set()),
            num_scheduled_tokens={rid: len(prompt) - matched}, finished_req_ids=set())
        worker.bind_connector_metadata(sched.build_connector_meta(out))
        t.append(time.perf_counter())
        worker.start_load_kv(SimpleNamespace())
        t.append(time.perf_counter())
        for n in names:
            worker.wait_for_layer_load(n)
        t.append(time.perf_counter())
        for i, n in enumerate(names):
            worker.save_kv_layer(n, caches[i], None)
        worker.wait_for_save()
        worker.clear_connector_metadata()
        t.append(time.perf_counter())
        sched.request_finished(req, ids)
        stages = ("scheduler lookup", "meta", "start_load_kv", "wait_for_layer_load x32",
                  "save_kv_layer x32 + wait_for_save")
        return matched, dict(zip(stages, (b - a for a, b in zip(t, t[1:])))) | {
            "all": t[-1] - t[0]}

    g = torch.Generator().manual_seed(ntok)
    res = {"cold": [], "warm": []}
    for r in range(runs + 1):
        prompt = torch.randint(32000, (ntok + 1,), generator=g).tolist()
        m0, cold = step(f"c{r}", prompt, list(range(nb + 1)))
        m1, warm = step(f"w{r}", prompt, list(range(2 * nb + 1, nb, -1)))
        assert (m0, m1) == (0, ntok), (m0, m1)
        if r:
            res["cold"].append(cold)
            res["warm"].append(warm)
    for k, rows in res.items():
        med = {s: statistics.median(x[s] for x in rows) * 1e3 for s in rows[0]}
        print(f"copy {copy:6} {ntok:5} tokens {k}: " +
              ", ".join(f"{s} {v:.2f}" for s, v in med.items()) + f" ms (median of {runs})")
    worker.shutdown()
    sched.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("socket")
    ap.add_argument("--tokens", default="2048,8192")
    ap.add_argument("--copy", default="auto,layers")
    ap.add_argument("--runs", type=int, default=6)
    a = ap.parse_args()
    torch.set_num_threads(1)
    for copy in a.copy.split(","):
        for n in a.tokens.split(","):
            measure(a.socket, int(n), copy, a.runs)


if __name__ == "__main__":
    main()
