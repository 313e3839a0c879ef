#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""One vLLM engine process of test_engines.py, driving kvclient.vllm's
KvcachedConnector the way vLLM v1 does, with the example engine's PyTorch
model (libclient/python/examples/engine_loop.py) whose paged KV cache is
vLLM's FlashAttention layout, one [2, num_blocks, block_size, kv_heads,
head_dim] tensor per layer.

The call sequence per request, as vLLM documents it (the docstrings of
KVConnectorBase_V1 and of its scheduler's schedule(): a scheduler-side
connector in the scheduler, a worker-side one in each worker):

  scheduler  get_num_new_matched_tokens(request, local computed tokens)
             (allocate blocks) update_state_after_alloc(request, blocks, n)
             build_connector_meta(scheduler_output)
  worker     bind_connector_metadata(meta); start_load_kv(forward_context)
             per attention layer: wait_for_layer_load(name) before it,
               save_kv_layer(name, kv, attn_metadata) after it
             wait_for_save(); get_finished(ids);
             get_block_ids_with_load_errors() (vLLM then recomputes from the
               first failed block); clear_connector_metadata()
  scheduler  request_finished(request, block_ids)

This tiny engine's forward runs block by block over all layers, so the
per-layer calls go around it (the connector does not depend on their
interleaving with attention).

  prefill: a cold prefill; the connector saves the prompt's blocks.
  chunked: the same prefill in chunks of --chunk tokens over several steps
           (chunked prefill); the connector saves each step's full blocks.
  load:    another block table; prints the matched tokens, checks the
           logits of the tokens computed here equal a cold prefill's bit
           for bit.
  kill:    as load, but SIGKILLs the daemon (--daemon-pid) after the
           scheduler's promise and before the worker loads: the worker
           reports the blocks failed, the engine recomputes them.

--drafter N adds N KV caches of a speculative decoding drafter (EAGLE,
MTP), numbered after the model's layers as vLLM numbers them, registered
first: the connector caches the model's layers only and leaves the
drafter's alone (load prints whether they are still all zeros).
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from types import SimpleNamespace

import torch

from engine_loop import Engine, TinyLlama
from kvclient.vllm import KvcachedConnector
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole


class ModelConfig:
    """vLLM's ModelConfig, as much as a connector reads."""

    def __init__(self, lm: TinyLlama, name: str):
        self.model, self.dtype, self.use_mla, self.revision = name, torch.float32, False, None
        self._lm = lm

    def get_num_layers(self, pc) -> int:
        return self._lm.layers // pc.pipeline_parallel_size

    def get_num_kv_heads(self, pc) -> int:
        return max(1, self._lm.kv_heads // pc.tensor_parallel_size)

    def get_head_size(self) -> int:
        return self._lm.head_dim


class Blocks:
    """vLLM's KVCacheBlocks: one KV cache group."""

    def __init__(self, ids):
        self.ids = list(ids)

    def get_block_ids(self):
        return (self.ids,)


def vllm_config(lm, name, sock, block_size, kv_block_tokens, copy="auto"):
    return SimpleNamespace(
        model_config=ModelConfig(lm, name),
        cache_config=SimpleNamespace(block_size=block_size, cache_dtype="auto"),
        parallel_config=SimpleNamespace(tensor_parallel_size=1, pipeline_parallel_size=1,
                                        rank=0),
        kv_transfer_config=SimpleNamespace(
            kv_connector="KvcachedConnector", kv_connector_module_path="kvclient.vllm",
            kv_role="kv_both", is_kv_producer=True,
            kv_connector_extra_config={"socket": sock, "block_tokens": kv_block_tokens,
                                       "copy": copy}))


def run_chunked(sched, worker, engine, prompt, block_order, chunk):
    """A cold prefill scheduled in chunks (chunked prefill): the first step
    schedules the request as new with the blocks of its first chunk, each
    later one as a cached request with the blocks its chunk adds; the
    connector saves the prompt blocks each step completes. Returns the
    logits and how many blocks kvcached held after each step."""
    bs = engine.lm.block_tokens
    req = SimpleNamespace(request_id="req-c", prompt_token_ids=prompt.tolist(),
                          cache_salt=None, lora_request=None, num_computed_tokens=0)
    assert sched.get_num_new_matched_tokens(req, 0) == (0, False)
    n_blocks = -(-len(prompt) // bs)
    ids = block_order[:n_blocks]
    out_logits, done, have = [], 0, 0
    table = torch.tensor(ids, dtype=torch.int64)
    while done < len(prompt):
        n = min(chunk, len(prompt) - done)
        upto = -(-(done + n) // bs)
        new_ids = ids[have:upto]
        if done == 0:
            sched.update_state_after_alloc(req, Blocks(new_ids), 0)
            out = SimpleNamespace(
                scheduled_new_reqs=[SimpleNamespace(req_id="req-c",
                                                    prompt_token_ids=req.prompt_token_ids,
                                                    block_ids=(list(new_ids),),
                                                    num_computed_tokens=0)],
                scheduled_cached_reqs=SimpleNamespace(req_ids=[], new_block_ids=[],
                                                      num_computed_tokens=[],
                                                      resumed_req_ids=set()),
                num_scheduled_tokens={"req-c": n}, finished_req_ids=set())
        else:
            out = SimpleNamespace(
                scheduled_new_reqs=[],
                scheduled_cached_reqs=SimpleNamespace(
                    req_ids=["req-c"], new_block_ids=[(list(new_ids),) if new_ids else None],
                    num_computed_tokens=[done], resumed_req_ids=set()),
                num_scheduled_tokens={"req-c": n}, finished_req_ids=set())
        have = upto
        meta = sched.build_connector_meta(out)
        worker.bind_connector_metadata(meta)
        worker.start_load_kv(SimpleNamespace())
        out_logits.append(engine.forward(prompt[:done + n], done, table))
        worker.wait_for_save()
        worker.clear_connector_metadata()
        done += n
        probe = SimpleNamespace(request_id="probe", prompt_token_ids=req.prompt_token_ids,
                                cache_salt=None, lora_request=None)
        yield_blocks = sched.get_num_new_matched_tokens(probe, 0)[0] // bs
        print(f"chunk: computed {done}, kvcached holds {yield_blocks} blocks")
    assert sched.request_finished(req, ids) == (False, None)
    return torch.cat(out_logits)


def run_request(sched, worker, engine, prompt, block_order, kill_pid=None, drafter=()):
    """One prefill through both sides; returns (matched, errors, logits)."""
    bs = engine.lm.block_tokens
    req = SimpleNamespace(request_id="req-0", prompt_token_ids=prompt.tolist(),
                          cache_salt=None, lora_request=None, num_computed_tokens=0)
    matched, is_async = sched.get_num_new_matched_tokens(req, 0)
    again, _ = sched.get_num_new_matched_tokens(req, 0)	# vLLM may ask twice
    assert (again, is_async) == (matched, False), (again, matched, is_async)
    n_blocks = -(-len(prompt) // bs)
    ids = block_order[:n_blocks]
    sched.update_state_after_alloc(req, Blocks(ids), matched)
    out = SimpleNamespace(
        scheduled_new_reqs=[SimpleNamespace(req_id="req-0", prompt_token_ids=req.prompt_token_ids,
                                            block_ids=(list(ids),),
                                            num_computed_tokens=matched)],
        scheduled_cached_reqs=SimpleNamespace(req_ids=[], new_block_ids=[],
                                              num_computed_tokens=[], resumed_req_ids=set()),
        num_scheduled_tokens={"req-0": len(prompt) - matched}, finished_req_ids=set())
    meta = sched.build_connector_meta(out)
    if kill_pid:
        os.kill(kill_pid, signal.SIGKILL)
        end = time.monotonic() + 20	# liveness bound: the daemon's socket closes
        c = worker._rc.c	# the worker's Client: wait until it sees the socket close
        while c is not None and c.connected() and time.monotonic() < end:
            time.sleep(0.01)
    worker.bind_connector_metadata(meta)
    worker.start_load_kv(SimpleNamespace())
    for i in range(engine.lm.layers):
        worker.wait_for_layer_load(f"model.layers.{i}.self_attn.attn")
    for name in drafter:	# the drafter's forward comes after the model's
        worker.wait_for_layer_load(name)
    errors = worker.get_block_ids_with_load_errors() if kill_pid else set()
    table = torch.tensor(ids, dtype=torch.int64)
    start = matched
    if errors:	# vLLM recomputes from the first block that failed
        start = min(ids.index(b) for b in errors) * bs
    logits = engine.forward(prompt, start, table)
    for i in range(engine.lm.layers):
        worker.save_kv_layer(f"model.layers.{i}.self_attn.attn", engine.cache[i], None)
    for name in drafter:
        worker.save_kv_layer(name, drafter[name], None)
    worker.wait_for_save()
    errors |= worker.get_block_ids_with_load_errors()
    assert worker.get_finished({"req-0"}) == (None, None)
    worker.clear_connector_metadata()
    assert sched.request_finished(req, ids) == (False, None)
    return matched, errors, start, logits


class NoClientEngine(Engine):
    """engine_loop's Engine without a kvclient (the connector moves the KV)."""

    def __init__(self, lm, num_blocks):
        self.lm, self.client = lm, None
        shape = (2, num_blocks, lm.block_tokens, lm.kv_heads, lm.head_dim)
        self.cache = [torch.zeros(shape) for _ in range(lm.layers)]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=("prefill", "chunked", "load", "kill"))
    ap.add_argument("--chunk", type=int, default=48,
                    help="chunked: tokens a step (whole blocks: the engine computes from block starts)")
    ap.add_argument("--socket", required=True)
    ap.add_argument("--blocks", type=int, default=6, help="prompt length in vLLM blocks")
    ap.add_argument("--block-size", type=int, default=16, help="vLLM's block_size")
    ap.add_argument("--kv-block-tokens", type=int, default=16, help="kvcached's")
    ap.add_argument("--daemon-pid", type=int)
    ap.add_argument("--copy", default="auto", help="the connector's copy option")
    ap.add_argument("--drafter", type=int, default=0, help="a drafter's extra layers")
    args = ap.parse_args()
    torch.set_num_threads(1)

    lm = TinyLlama(seed=7, block_tokens=args.block_size)
    bs = args.block_size
    g = torch.Generator().manual_seed(8)
    prompt = torch.randint(lm.vocab, (args.blocks * bs + 5,), generator=g)
    nb = args.blocks + 2
    cfg = vllm_config(lm, "tinyllama-vllm", args.socket, bs, args.kv_block_tokens, args.copy)
    sched = KvcachedConnector(cfg, KVConnectorRole.SCHEDULER)
    worker = KvcachedConnector(cfg, KVConnectorRole.WORKER)
    if args.mode in ("prefill", "chunked"):
        engine = NoClientEngine(lm, nb)
        order = list(range(nb))
    else:	# another block table, a larger cache
        engine = NoClientEngine(lm, 2 * nb)
        order = list(range(2 * nb))[::-1]
    drafter = {f"model.layers.{lm.layers + i}.self_attn.attn": torch.zeros_like(engine.cache[0])
               for i in range(args.drafter)}
    worker.register_kv_caches({**drafter, **{f"model.layers.{i}.self_attn.attn": t
                                             for i, t in enumerate(engine.cache)}})
    if args.mode == "chunked":
        logits = run_chunked(sched, worker, engine, prompt, order, args.chunk)
        cold = NoClientEngine(lm, nb)
        full = cold.forward(prompt, 0, torch.tensor([(3 * i + 1) % nb for i in range(nb)]))
        print(f"chunked: equal {torch.equal(logits, full)}")
        worker.shutdown()
        sched.shutdown()
        return 0
    matched, errors, start, logits = run_request(
        sched, worker, engine, prompt, order,
        args.daemon_pid if args.mode == "kill" else None, drafter)
    cold = NoClientEngine(lm, nb)
    full = cold.forward(prompt, 0, torch.tensor([(3 * i + 1) % nb for i in range(nb)]))
    equal = torch.equal(logits, full[start:])
    print(f"{args.mode}: matched {matched} errors {len(errors)} computed from {start} "
          f"equal {equal}")
    if drafter:
        print(f"drafter: untouched {all(not t.any() for t in drafter.values())}")
    worker.shutdown()
    sched.shutdown()
    return 0 if equal else 1


if __name__ == "__main__":
    sys.exit(main())
