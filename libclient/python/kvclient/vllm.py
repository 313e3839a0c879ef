# SPDX-License-Identifier: MIT
"""kvcached as a vLLM v1 KV connector: ``KvcachedConnector``.

Selected with::

    --kv-transfer-config '{"kv_connector":"KvcachedConnector",
        "kv_connector_module_path":"kvclient.vllm","kv_role":"kv_both",
        "kv_connector_extra_config":{"socket":"/run/kvcached/kvcached.sock"}}'

vLLM builds one connector in the scheduler process (role SCHEDULER) and one
in each worker (role WORKER); each opens its own kvclient.Client. Written
against vLLM's documented ``KVConnectorBase_V1`` (see docs/ENGINES.md for
the versions followed); nothing here is vLLM code.

Scheduler side: ``get_num_new_matched_tokens`` looks the prompt's full
blocks up in rank 0's namespace and releases the request at once (no pin,
no page is held: vLLM may ask again), ``update_state_after_alloc`` notes
where the hits go, ``build_connector_meta`` hands the workers, per step,
the blocks to load and the prompt blocks newly computed to save.

Worker side: ``start_load_kv`` looks the blocks up again in this rank's
namespace and copies the hits into vLLM's paged buffer, one of three ways:

* vLLM's buffers on a GPU (a cuda pool, or a host pool the library has
  registered with CUDA: kvc_gpu_prepare at ``register_kv_caches``): every
  layer's copy is queued at once on a load stream of the connector's own,
  one kernel launch per layer and request, each followed by that layer's
  event; ``wait_for_layer_load(layer i)`` makes the engine's stream wait
  for layer i's events only (on the GPU: no Python thread, no CPU wait),
  so layer i computes while later layers load. ``save_kv_layer(layer i)``
  queues layer i's copy of the step's new prompt blocks on a save stream,
  after an event on the engine's stream (the layer's attention wrote
  them); ``wait_for_save`` waits for the save stream and publishes.
* CPU buffers on a host pool: one gather for every layer, in a thread that
  releases the GIL (the first ``wait_for_layer_load`` waits for it);
  ``wait_for_save`` scatters the newly computed prompt blocks and
  publishes them.
* page views, layer by layer (a kvcached block larger than vLLM's, ``"copy":
  "pages"``, or GPU buffers on a host pool where this process has no CUDA
  to register it with: said once in the log), where
  ``wait_for_layer_load(layer i)`` waits for layer i only.

``"copy": "layers"`` runs the first way's order with CPU buffers, each copy
done on return (for tests and debugging).

Blocks a worker could not load (evicted since the scheduler looked, daemon
gone) are reported by ``get_block_ids_with_load_errors`` and vLLM
recomputes them.

Tensor parallelism: every rank of every TP size shares one namespace and
one page per block (kvcached pages hold every KV head of the model); each
rank moves only its own heads, the ranks of an engine write each page
together (each its slice), and a rank whose heads another rank writes
(replicated heads, an MLA rank other than 0) only reads. So a prompt an
engine at TP 2 cached is a full hit for one at TP 1 or TP 4.

MLA models (``use_mla``: DeepSeek, Kimi K2): vLLM's MLA cache, one tensor
per layer [num_blocks, block_size, head_size] (kv_lora_rank + rope dims),
is one latent per token and layer; rank 0 writes it, every rank reads the
same pages.

kvcached being unreachable never fails a request: no daemon, a lost
connection or a full pool make the connector report 0 matched tokens and
skip saves; it reconnects at most once a second.

``"no_insert": true`` in the extra config makes the engine a reader: it
loads what others cached and saves nothing (its Client is no-insert,
KVC_OPEN_NO_INSERT), so none of its KV stays on the host. A tenant the
daemon's config makes no-insert is found out at the first save and
treated the same.
"""
from __future__ import annotations

import inspect
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Optional

from vllm.distributed.kv_transfer.kv_connector.v1.base import (KVConnectorBase_V1,
                                                             KVConnectorMetadata,
                                                             KVConnectorRole)

from .client import Client
from .model import Model
from .paged_kv import PagedKV
from ._engine import Reconnecting, flag, namespace_name, read_only
from .errors import KvcError, NoInsertError

# Under "vllm.": vLLM's logging configuration (the "vllm" logger's handler)
# prints it in the engine's log, with vLLM's own lines.
log = logging.getLogger("vllm.kvclient")

__all__ = ["KvcachedConnector", "KvcachedConnectorMetadata"]

# vLLM's cache_dtype names -> kvclient dtype names ("auto": the model's).
_CACHE_DTYPES = {"fp8": "float8_e4m3fn", "fp8_e4m3": "float8_e4m3fn",
                 "fp8_e5m2": "float8_e5m2", "bfloat16": "bfloat16", "float16": "float16",
                 "half": "float16", "float32": "float32", "float": "float32"}


@dataclass
class LoadSpec:
    """Load tokens [start, end) of a request into its vLLM blocks."""
    req_id: str
    tokens: list
    extra: Optional[bytes]
    block_ids: list
    start: int
    end: int


@dataclass
class SaveSpec:
    """Save the request's first len(tokens) prompt tokens (whole kvcached
    blocks) from its vLLM blocks."""
    req_id: str
    tokens: list
    extra: Optional[bytes]
    block_ids: list


@dataclass
class KvcachedConnectorMetadata(KVConnectorMetadata):
    loads: list = field(default_factory=list)
    saves: list = field(default_factory=list)


class _Streams:
    """The layer-wise path's streams and events (torch.cuda), made once:
    a load stream, a save stream, per layer an event for saves, and per
    request loaded in a step a list of per-layer events, reused step
    after step (a wait takes an event's last record when it is queued)."""

    device: Optional[int]	# None: _Sync, no device

    def __init__(self, device: int, layers: int) -> None:
        import torch
        self.torch, self.device, self.layers = torch, device, layers
        dev = torch.device("cuda", device)
        self.load = torch.cuda.Stream(device=dev)
        self.save = torch.cuda.Stream(device=dev)
        self.load_events: list = []
        self.save_events = self.events()
        self.load_done = torch.cuda.Event()
        self.load_done.record(self.load)
        self.load.synchronize()

    def events(self) -> list:
        """One event per layer, each recorded once (torch makes the CUDA
        event at its first record; the library records it then)."""
        evs = [self.torch.cuda.Event() for _ in range(self.layers)]
        for e in evs:
            e.record(self.load)
        return evs

    def _engine(self) -> Any:
        return self.torch.cuda.current_stream(self.device)

    def loads_after_engine(self) -> None:
        """Loads go after what the engine queued (its freed blocks' readers)."""
        self.load.wait_stream(self._engine())

    def engine_waits(self, ev: Any) -> None:
        """The engine's stream waits for ev (None: every load of the step)."""
        self._engine().wait_event(self.load_done if ev is None else ev)

    def loads_queued(self) -> None:
        self.load_done.record(self.load)

    def loads_wait(self) -> None:
        self.load_done.synchronize()

    def save_after_engine(self, layer: int) -> None:
        ev = self.save_events[layer]
        ev.record(self._engine())
        self.save.wait_event(ev)

    def saves_wait(self) -> None:
        self.save.synchronize()


class _Sync(_Streams):
    """The same order with copies that are done on return (CPU tensors,
    ``"copy": "layers"``): no stream, no event, nothing to wait for."""

    def __init__(self, layers: int) -> None:
        self.device, self.layers = None, layers
        self.load = self.save = None
        self.load_events: list = []
        self.save_events = self.events()

    def events(self) -> list:
        return [None] * self.layers

    def loads_after_engine(self) -> None:
        pass

    def engine_waits(self, ev: Any) -> None:
        pass

    def loads_queued(self) -> None:
        pass

    def loads_wait(self) -> None:
        pass

    def save_after_engine(self, layer: int) -> None:
        pass

    def saves_wait(self) -> None:
        pass


@dataclass
class _ReqState:
    tokens: list
    extra: Optional[bytes]
    block_ids: list = field(default_factory=list)
    computed: int = 0
    saved: int = 0			# kvcached blocks handed to a save
    load: Optional[tuple] = None	# (start, end) to load this step


def _extra_of(request: Any) -> Optional[bytes]:
    """The request's extra keys: vLLM's cache_salt, its LoRA adapter and
    its multimodal inputs' hashes, which make the same tokens different KV
    (mixed into every block: a prompt with an image shares no block with
    one without, even before the image)."""
    parts = []
    salt = getattr(request, "cache_salt", None)
    if salt:
        parts.append(b"salt:" + str(salt).encode())
    lora = getattr(request, "lora_request", None)
    if lora is not None:
        parts.append(b"lora:" + str(getattr(lora, "lora_name", lora)).encode())
    mm = getattr(request, "mm_hashes", None) or [
        getattr(f, "identifier", f) for f in getattr(request, "mm_features", None) or []]
    if mm:
        parts.append(b"mm:" + ",".join(str(h) for h in mm).encode())
    return b"\0".join(parts) or None


def _kv_heads(mc: Any, pc: Any) -> int:
    """The model's KV heads, every tensor-parallel rank's together (a
    kvcached page holds them all); vLLM's get_num_kv_heads is one rank's."""
    total = getattr(mc, "get_total_num_kv_heads", None)
    if total is not None:
        return int(total())
    return int(mc.get_num_kv_heads(pc)) * int(pc.tensor_parallel_size)


def _layer_number(name: str) -> Optional[int]:
    """The layer index in a vLLM layer name ("model.layers.12.self_attn.attn"
    -> 12): its last dotted part that is a number."""
    for part in reversed(name.split(".")):
        if part.isdigit():
            return int(part)
    return None


def _model_layers(kv_caches: dict, layers: int) -> Optional[list]:
    """The names of the model's own layers among vLLM's KV caches, in layer
    order: all of them when there are `layers`; when there are more (an
    EAGLE or MTP drafter's layers, which vLLM numbers after the model's),
    the `layers` lowest-numbered. None when there are fewer."""
    names = list(kv_caches)
    if len(names) < layers:
        return None
    if len(names) == layers:
        return names
    nums = [_layer_number(n) for n in names]
    if None in nums:	# unnumbered: vLLM registers the model's layers first
        return names[:layers]
    order = sorted(range(len(names)), key=lambda i: (nums[i], i))
    return [names[i] for i in sorted(order[:layers])]


def _model_name(vllm_config: Any, extra: dict, dtype: str) -> str:
    """extra's model_name, else vLLM's model and its revision
    ("meta-llama/Llama-3.1-8B@main"), then "/" and the KV dtype."""
    name = extra.get("model_name")
    if not name:
        mc = vllm_config.model_config
        rev = getattr(mc, "revision", None)
        name = f"{mc.model}{'@' + rev if rev else ''}"
    return namespace_name(name, dtype)


def _base_takes_kv_cache_config() -> bool:
    """Does this vLLM's KVConnectorBase_V1.__init__ take kv_cache_config
    (vLLM since about v0.11), or only (vllm_config, role) (before)?"""
    try:
        params = list(inspect.signature(KVConnectorBase_V1.__init__).parameters.values())
    except (TypeError, ValueError):
        return True
    pos = [p for p in params[1:] if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(pos) >= 3 or any(p.kind == p.VAR_POSITIONAL for p in params)


class KvcachedConnector(KVConnectorBase_V1):
    """kvcached as vLLM's KV connector (see the module docstring)."""

    # The base's constructor as this vLLM has it: the older one takes two
    # arguments and refuses a third.
    _BASE_3_ARGS = _base_takes_kv_cache_config()

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None) -> None:
        if self._BASE_3_ARGS:
            super().__init__(vllm_config, role, kv_cache_config)
        else:
            super().__init__(vllm_config, role)
        ktc = vllm_config.kv_transfer_config
        extra = dict(getattr(ktc, "kv_connector_extra_config", None) or {})
        mc, cc, pc = vllm_config.model_config, vllm_config.cache_config, vllm_config.parallel_config
        mla = bool(getattr(mc, "use_mla", False))
        self.block_size = int(cc.block_size)
        self.block_tokens = int(extra.get("block_tokens", self.block_size))
        B, T = self.block_size, self.block_tokens
        if B % T and T % B:
            raise ValueError(f"KvcachedConnector: vLLM's block_size {B} is neither a multiple "
                             f"nor a divisor of kvcached's block tokens {T} "
                             "(kv_connector_extra_config block_tokens, which must equal the "
                             "daemon's block-tokens)")
        cdt = str(getattr(cc, "cache_dtype", "auto") or "auto")
        head_dim = int(mc.get_head_size())
        if cdt == "auto":
            dtype = str(mc.dtype).replace("torch.", "")
        elif cdt == "fp8_ds_mla":	# FlashMLA's packed 656-byte token record
            dtype, head_dim = "uint8", 656
        else:
            dtype = _CACHE_DTYPES.get(cdt, cdt)
        tp, pp = int(pc.tensor_parallel_size), int(pc.pipeline_parallel_size)
        if role == KVConnectorRole.WORKER:
            rank = int(getattr(pc, "rank", 0))
            tp_rank, pp_rank = rank % tp, (rank // tp) % pp
        else:	# the scheduler looks up as rank 0: the ranks share the pages
            tp_rank = pp_rank = 0
        self.model = Model(
            _model_name(vllm_config, extra, dtype), dtype,
            layers=int(mc.get_num_layers(pc)), kv_heads=1 if mla else _kv_heads(mc, pc),
            head_dim=head_dim, block_tokens=T, pos=extra.get("pos", "rope"),
            tp_rank=tp_rank, tp_size=tp, pp_rank=pp_rank, pp_size=pp, mla=mla)
        self.no_insert = flag(extra, "no_insert")
        self._rc = Reconnecting(self.model, extra.get("socket"), extra.get("salt", b""),
                                self._opened, "KvcachedConnector", logger=log,
                                no_insert=self.no_insert)
        self._rc.on_drop = self._dropped
        # Scheduler side.
        self._reqs: dict[str, _ReqState] = {}
        self._local: dict[str, int] = {}	# get_num_new_matched_tokens' last answer
        # Worker side.
        self._caches: Any = None	# vLLM's tensors, one per layer (register_kv_caches)
        self._kv: Optional[PagedKV] = None
        self._layout: Optional[str] = None
        self._load_errors: set[int] = set()
        self._load_thread: Optional[threading.Thread] = None
        self._load_reqs: list = []
        self._layer_index: dict = {}
        self._layer_loaded: list = []
        # GPU copies (_gpu_setup): the connector's streams, events reused
        # step after step, this step's loads' events and save jobs.
        self._gpu: Any = None	# a _Streams, or None: no GPU copies
        self._load_events: list = []	# per request loaded: one event per layer
        self._loads_done = False	# this step's loads are queued
        self._saves: Any = None	# [request, first block, engine ids, SaveSpec]
        self._saved_layers: set = set()
        self._said: set = set()
        rw = extra.get("register_wait", 10)
        try:
            self._register_wait = float(rw)
        except (TypeError, ValueError):
            self._register_wait = -1.0
        if not self._register_wait >= 0:
            raise ValueError(f"KvcachedConnector: register_wait {rw!r}: seconds, a number "
                             ">= 0")
        self._copy = extra.get("copy", "auto")
        if self._copy not in ("auto", "pages", "layers"):
            raise ValueError(f"KvcachedConnector: copy {self._copy!r}: 'auto', 'pages' or "
                             "'layers'")

    # ------------------------------------------------------ the Client

    def _client(self) -> Optional[Client]:
        """The Client, (re)opened when the daemon is there; None when not."""
        return self._rc.get()

    def _opened(self, c: Any) -> None:
        if self._caches is not None:
            self._kv = self._paged(c)
            self._gpu_setup()

    def _dropped(self) -> None:
        self._kv = None
        self._loads_finished()	# GPU loads still read the pages they pin
        self._release_loads()

    def _drop_client(self, why: str) -> None:
        self._rc.drop(why)

    # ---------------------------------------------------- scheduler side

    def get_num_new_matched_tokens(self, request: Any,
                                   num_computed_tokens: int) -> tuple[int, bool]:
        """Tokens after num_computed_tokens that kvcached holds (whole vLLM
        blocks, never the prompt's last token), loaded synchronously.
        Holds nothing: the lookup's request is released at once."""
        B, T = self.block_size, self.block_tokens
        tokens = request.prompt_token_ids
        limit = ((len(tokens) - 1) // B) * B	# vLLM computes at least the last token
        nb = limit // T
        if nb == 0 or limit <= num_computed_tokens:
            return 0, False
        c = self._client()
        if c is None:
            return 0, False
        try:
            with c.request(tokens[:nb * T], extra=_extra_of(request)) as r:
                hits = r.lookup()
        except KvcError as e:
            self._drop_client(str(e))
            return 0, False
        matched = (hits * T // B) * B - num_computed_tokens
        self._local[request.request_id] = num_computed_tokens
        return max(matched, 0), False

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        st = self._reqs.get(request.request_id)
        if st is None:
            st = self._reqs[request.request_id] = _ReqState(list(request.prompt_token_ids),
                                                            _extra_of(request))
        if num_external_tokens > 0:
            start = self._local.pop(request.request_id, 0)
            st.block_ids = list(blocks.get_block_ids()[0])
            st.load = (start, start + num_external_tokens)

    def build_connector_meta(self, scheduler_output: Any) -> KvcachedConnectorMetadata:
        meta = KvcachedConnectorMetadata()
        for new in scheduler_output.scheduled_new_reqs:
            st = self._reqs.get(new.req_id)
            if st is None:	# never seen (no cache_salt known): never saved
                toks = list(new.prompt_token_ids)
                st = self._reqs[new.req_id] = _ReqState(toks, None,
                                                        saved=len(toks) // self.block_tokens)
            st.block_ids = list(new.block_ids[0])
            st.computed = new.num_computed_tokens
        cached = scheduler_output.scheduled_cached_reqs
        resumed = getattr(cached, "resumed_req_ids", None)
        if resumed is None:	# vLLM before resumed_req_ids: one flag per request
            flags = getattr(cached, "resumed_from_preemption", None) or []
            resumed = {r for r, f in zip(cached.req_ids, flags) if f}
        for i, rid in enumerate(cached.req_ids):
            st = self._reqs.get(rid)
            if st is None:
                continue
            nb = cached.new_block_ids[i]
            if rid in resumed:	# preempted and back: a new block list
                st.block_ids = list(nb[0]) if nb else []
            elif nb:
                st.block_ids.extend(nb[0])
            st.computed = cached.num_computed_tokens[i]
        T = self.block_tokens
        for rid, n in scheduler_output.num_scheduled_tokens.items():
            st = self._reqs.get(rid)
            if st is None:
                continue
            if st.load is not None:
                meta.loads.append(LoadSpec(rid, st.tokens, st.extra, list(st.block_ids),
                                           *st.load))
                st.load = None
            done = min(st.computed + n, len(st.tokens)) // T
            if done > st.saved:
                meta.saves.append(SaveSpec(rid, st.tokens[:done * T], st.extra,
                                           list(st.block_ids)))
                st.saved = done
        return meta

    def request_finished(self, request: Any, block_ids: Any) -> tuple[bool, Optional[dict]]:
        self._reqs.pop(request.request_id, None)
        self._local.pop(request.request_id, None)
        return False, None	# saves are done within the step: free the blocks now

    # ------------------------------------------------ what vLLM asks of it

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: dict) -> bool:
        """True: the loads are waited for in wait_for_layer_load (GPU
        copies by the layer's events on the current stream there) and the
        saves queued in save_kv_layer, which a replayed full CUDA graph
        skips; vLLM's PIECEWISE mode runs the
        attention layers, and so these calls, outside the graphs. Every
        copy mode waits there, so whatever extra_config says."""
        return True

    @property
    def requires_kv_delivery(self) -> bool:
        """False: a best-effort cache. Saves finish within their step, and
        a save that did not happen (a request preempted, kvcached away) is
        only a later miss, never lost KV that another engine waits for."""
        return False

    # ------------------------------------------------------- worker side

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config: Any) -> Optional[str]:
        return "NHD"	# a block dense [block_size, kv_heads, head_dim]

    def register_kv_caches(self, kv_caches: dict) -> None:
        """vLLM's per-layer paged buffers, in layer order. Supported: the
        FlashAttention layout [2, num_blocks, block_size, kv_heads,
        head_dim] and the FlashInfer one [num_blocks, 2, block_size,
        kv_heads, head_dim], NHD, with this rank's kv_heads; for MLA the
        MLA cache [num_blocks, block_size, head_size]."""
        names = _model_layers(kv_caches, self.model.layers)
        if names is None:
            raise ValueError(f"KvcachedConnector: {len(kv_caches)} KV caches for a model of "
                             f"{self.model.layers} layers (hybrid models with several KV "
                             "cache groups are not supported)")
        if len(names) < len(kv_caches):
            extra = [n for n in kv_caches if n not in names]
            log.warning("KvcachedConnector: %d KV cache(s) past the model's %d layers, a "
                        "speculative decoding drafter's (%s), are not cached: a hit loads "
                        "the model's layers only, so the drafter may propose worse tokens "
                        "after a loaded prefix (the output is the model's either way)",
                        len(extra), self.model.layers, ", ".join(extra))
        caches = [kv_caches[n] for n in names]
        t = caches[0]
        inner = (self.block_size, self.model.heads[1], self.model.head_dim)
        if self.model.mla:
            if t.dim() == 3 and t.shape[1:] == (self.block_size, self.model.head_dim):
                self._layout = "mla"
            else:
                raise ValueError(f"KvcachedConnector: MLA cache shape {tuple(t.shape)} is not "
                                 f"[blocks, {self.block_size}, {self.model.head_dim}] "
                                 "(kv_lora_rank + rope dims)")
        elif t.dim() == 5 and t.shape[0] == 2 and tuple(t.shape[2:]) == inner:
            self._layout = "flash"
        elif t.dim() == 5 and t.shape[1] == 2 and tuple(t.shape[2:]) == inner:
            self._layout = "flashinfer"
        else:
            raise ValueError(f"KvcachedConnector: KV cache shape {tuple(t.shape)} is not "
                             f"[2, blocks, {inner[0]}, {inner[1]}, {inner[2]}] (FlashAttention,"
                             f" {inner[1]}: this rank's KV heads) nor [blocks, 2, ...] "
                             "(FlashInfer); other layouts are not supported")
        if self._layout == "flashinfer" and self.block_size != self.block_tokens:
            raise ValueError(f"KvcachedConnector: the FlashInfer layout needs vLLM's "
                             f"block_size {self.block_size} equal to kvcached's block tokens "
                             f"{self.block_tokens}")
        self._caches = caches
        self._layer_index = {name: i for i, name in enumerate(names)}
        c = self._rc.c or self._client()
        if c is not None and self._kv is None:
            self._kv = self._paged(c)
        self._gpu_setup()

    def _say_once(self, key: str, msg: str, *args: Any) -> None:
        if key not in self._said:
            self._said.add(key)
            log.warning(msg, *args)

    def _paged(self, c: Any) -> Optional[PagedKV]:
        """How this rank moves KV: a PagedKV over vLLM's buffers in kvcached
        blocks (a vLLM block of m kvcached blocks viewed as m blocks) for
        gather/scatter; or None for page views, layer by layer: when a
        kvcached block spans several vLLM blocks, when kv_connector_extra_config
        says "copy": "pages", or when vLLM's buffers are on a GPU, the pool
        in host memory and this process cannot register it with CUDA (the
        reason is logged once)."""
        B, T = self.block_size, self.block_tokens
        on_gpu = self._caches[0].device.type != "cpu"
        if c.pool_kind != "host":
            if B % T:
                raise ValueError(f"KvcachedConnector: vLLM blocks of {B} tokens, smaller "
                                 f"than kvcached's {T}, need a host pool")
            if self._copy == "pages":
                raise ValueError("KvcachedConnector: copy 'pages' needs a host pool")
        elif B % T or self._copy == "pages":
            return None
        m = B // T
        h, d = self.model.heads[1], self.model.head_dim
        try:
            if self._layout == "mla":
                kv = PagedKV(c, [x.view(x.shape[0] * m, T, d) for x in self._caches])
            elif self._layout == "flash":
                kv = PagedKV(c, [x.view(2, x.shape[1] * m, T, h, d)
                                         for x in self._caches])
            else:
                kv = PagedKV(c, [x[:, 0] for x in self._caches],
                                     [x[:, 1] for x in self._caches])
        except KvcError as e:
            if c.pool_kind != "host" or not on_gpu:
                raise
            self._say_once("gpu", "kvcached: the host pool cannot be shared with this GPU "
                           "(%s): copying page by page, far below the bus's speed", e)
            return None
        if c.pool_kind == "host" and kv.device is not None:
            self._registered(c)
        return kv

    def _registered(self, c: Any) -> None:
        """A host pool being registered with CUDA (PagedKV started it): wait
        for it here, at start-up, up to register_wait seconds (default 10:
        about 100 GiB of pool), so that the first requests copy at the
        bus's speed; a larger pool goes on registering in the background,
        its pages copied piece by piece until their chunk is done."""
        wait = self._register_wait
        end = time.monotonic() + wait
        st = c.gpu_status()
        while st["state"] == "registering" and time.monotonic() < end:
            time.sleep(0.005)
            st = c.gpu_status()
        if st["state"] == "registering":
            log.info("kvcached: %d of %d chunks of the host pool registered with CUDA in "
                     "%.1f s; the rest goes on in the background", st["chunks_registered"],
                     st["chunks"], wait)
        else:
            self._say_status()

    def _gpu_setup(self) -> None:
        """The layer-wise path (GPU copies, or ``"copy": "layers"``): its
        streams and events, made once here, off the request path."""
        kv = self._kv
        if kv is None or (kv.device is None and self._copy != "layers"):
            self._gpu = None
        elif self._gpu is None or self._gpu.device != kv.device:
            L = len(self._caches)
            self._gpu = _Sync(L) if kv.device is None else _Streams(kv.device, L)

    def _engine_ids(self, block_ids: list, first: int, n: int) -> list:
        """Engine block ids (in _paged's view) of kvcached blocks first..first+n-1."""
        m = self.block_size // self.block_tokens
        if m == 1:
            return block_ids[first:first + n]
        return [block_ids[j // m] * m + j % m for j in range(first, first + n)]

    def _segments(self, block_ids: list, first: int, n: int, from_token: int = 0) -> list:
        """(kvcached block, offset in it, vLLM block, offset in it, tokens)
        for the tokens of kvcached blocks first..first+n-1 from from_token
        on, cut at both block sizes' boundaries."""
        B, T = self.block_size, self.block_tokens
        step = min(B, T)
        out = []
        for j in range(first, first + n):
            for t in range(j * T, (j + 1) * T, step):
                if t >= from_token:
                    out.append((j, t - j * T, block_ids[t // B], t % B, step))
        return out

    def _copy_layer(self, pages: dict, segs: list, layer: int, load: bool) -> None:
        """Copy one layer of segs between page views (pages[j]: kvcached
        block j's page, [layers, 2, T, heads, head_dim] with every head of
        the model, of which this rank's; [layers, T, head_dim] for MLA) and
        vLLM's buffer."""
        x = self._caches[layer]
        h0, hn = self.model.heads
        for j, po, b, bo, n in segs:
            if self._layout == "mla":
                src, dst = pages[j][layer, po:po + n], x[b, bo:bo + n]
            else:
                src = pages[j][layer, :, po:po + n, h0:h0 + hn]
                dst = x[:, b, bo:bo + n] if self._layout == "flash" else x[b, :, bo:bo + n]
            if load:
                dst.copy_(src)
            else:
                src.copy_(dst)

    def _page_views(self, req: Any, first: int, n: int) -> dict:
        return {j: req.page_tensor(j) for j in range(first, first + n)}

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        if not meta.loads:
            return
        B, T = self.block_size, self.block_tokens
        c = self._client()
        work = []
        for ld in meta.loads:
            first, last = ld.start // T, -(-ld.end // T)
            hits = 0
            if c is not None:
                try:
                    req = c.request(ld.tokens[:last * T], extra=ld.extra)
                    self._load_reqs.append(req)
                    hits = min(req.lookup(), last)
                except KvcError as e:
                    self._drop_client(str(e))
                    c = None
            if hits > first:
                work.append((req, ld, first, hits))
            # What the scheduler promised and this rank cannot load: vLLM
            # recomputes those blocks.
            bad_from = max(hits * T, ld.start)
            self._load_errors.update(ld.block_ids[t // B] for t in range(bad_from, ld.end, B))
        if c is None:	# dropped part way: what was looked up is released
            for req, ld, first, hits in work:
                self._load_failed(ld, KvcError(0, "the connection to kvcached ended"))
            return
        if not work:
            return
        if self._gpu is not None:
            return self._load_gpu(work)
        if self._kv is not None:
            target = self._gather_all
        else:	# layer by layer: layer i's event is set once it is loaded
            self._layer_loaded = [threading.Event() for _ in self._caches]
            target = self._load_layers
        self._load_thread = threading.Thread(target=target, args=(work,),
                                             name="kvcached-load", daemon=True)
        self._load_thread.start()

    def _load_gpu(self, work: Any) -> None:
        """Every layer's copy queued on the load stream, an event after each
        layer of each request; nothing here waits."""
        g = self._gpu
        g.loads_after_engine()
        for req, ld, first, hits in work:
            while len(g.load_events) <= len(self._load_events):
                g.load_events.append(g.events())
            evs = g.load_events[len(self._load_events)]
            try:
                req.gather(self._kv, self._engine_ids(ld.block_ids, first, hits - first),
                           first, stream=g.load, layer_events=evs)
                self._load_events.append(evs)
            except Exception as e:
                self._load_failed(ld, e)
                # Some layers may be queued, and vLLM recomputes these
                # blocks: the engine waits for every load before it writes.
                self._load_events.append([None] * len(evs))
        g.loads_queued()
        self._loads_done = True

    def _load_failed(self, ld: Any, e: Exception) -> None:
        """A load that failed part way: its blocks are recomputed."""
        log.warning("kvcached: loading %s failed: %s", ld.req_id, e)
        self._load_errors.update(ld.block_ids[t // self.block_size]
                                 for t in range(ld.start, ld.end, self.block_size))

    def _gather_all(self, work: Any) -> None:
        """One gather per request, every layer in one pass (GIL released)."""
        for req, ld, first, hits in work:
            try:
                req.gather(self._kv, self._engine_ids(ld.block_ids, first, hits - first),
                           first)
            except Exception as e:
                self._load_failed(ld, e)

    def _load_layers(self, work: Any) -> None:
        """Page views, layer by layer, so that layer i computes while layer
        i+1 loads."""
        jobs: list = []
        for req, ld, first, hits in work:
            try:
                jobs.append((ld, self._page_views(req, first, hits - first),
                             self._segments(ld.block_ids, first, hits - first, ld.start)))
            except Exception as e:
                self._load_failed(ld, e)
        try:
            for layer, done in enumerate(self._layer_loaded):
                for ld, pages, segs in jobs:
                    try:
                        self._copy_layer(pages, segs, layer, True)
                    except Exception as e:
                        self._load_failed(ld, e)
                done.set()
        finally:
            for done in self._layer_loaded:
                done.set()

    def wait_for_layer_load(self, layer_name: str) -> None:
        """GPU copies: the engine's stream waits (on the GPU) for this
        layer's events. Page views: wait until this layer is loaded. CPU
        gather: one copy moves every layer, the first layer waits for it.
        An unknown name (or "") waits for everything."""
        i = self._layer_index.get(layer_name)
        if self._load_events:
            j = i if i is not None else -1
            for evs in self._load_events:
                self._gpu.engine_waits(evs[j])
            return
        t = self._load_thread
        if t is None:
            return
        if self._kv is None and i is not None and i + 1 < len(self._layer_loaded):
            self._layer_loaded[i].wait()
            return
        self._load_thread = None
        t.join()
        self._release_loads()

    def _loads_finished(self) -> None:
        """Layer-wise loads: wait until the copies are done (long done by
        the end of the step), so that their pins can go."""
        if self._loads_done:
            self._gpu.loads_wait()
        self._loads_done = False
        self._load_events = []

    def _release_loads(self) -> None:
        reqs, self._load_reqs = self._load_reqs, []
        for r in reqs:
            try:
                r.release()
            except KvcError:
                pass

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any,
                      **kwargs: Any) -> None:
        """GPU copies: queue this layer's copy of the step's new prompt
        blocks on the save stream, after what the engine's stream has
        queued so far (this layer's attention wrote them). The first call
        of a step asks kvcached for the pages. CPU copies: nothing per
        layer; wait_for_save copies every layer in one pass."""
        if self._gpu is None or self._kv is None:
            return
        i = self._layer_index.get(layer_name)
        if i is None or i in self._saved_layers:
            return
        if self._saves is None:
            self._saves = self._save_jobs()
        if self._saves:
            self._save_layers(i, 1)
        self._saved_layers.add(i)

    def _save_jobs(self) -> list:
        """Pages for this step's new prompt blocks (lookup, alloc): a job
        per request with pages granted."""
        meta = self._get_connector_metadata()
        jobs: list = []
        if not meta.saves or self.no_insert or not self.model.writes:
            return jobs
        c = self._client()
        if c is None:
            return jobs
        for sv in meta.saves:
            r = None
            try:
                r = c.request(sv.tokens, extra=sv.extra)
                hits = r.lookup()
                got = r.alloc() if hits < r.blocks else 0
                if got:	# else cached already, or a pool full of pinned pages
                    jobs.append([r, hits, self._engine_ids(sv.block_ids, hits, got), sv])
                    r = None
            except KvcError as e:
                if not c.connected():
                    self._drop_client(str(e))
                    break
                log.warning("kvcached: saving %s: %s", sv.req_id, e)
            finally:
                if r is not None:
                    r.release()
        return jobs

    def _save_layers(self, first: int, n: int) -> None:
        """Queue layers first..first+n-1 of every save job on the save stream,
        after the engine's stream."""
        g = self._gpu
        g.save_after_engine(first)
        for job in self._saves:
            r, hits, ids, sv = job
            if r is None:
                continue
            try:
                r.scatter(self._kv, ids, hits, stream=g.save, first_layer=first, layers=n)
            except KvcError as e:
                log.warning("kvcached: saving %s: %s", sv.req_id, e)
                r.release()	# not published: its pages go back
                job[0] = None

    def _finish_gpu_saves(self) -> None:
        """Copies the engine did not announce (save_kv_layer not called for
        some layers) are queued now; then wait for the save stream and
        publish."""
        done, self._saved_layers = self._saved_layers, set()
        if self._saves is None:
            self._saves = self._save_jobs() if self._kv is not None else []
        saves = self._saves
        try:
            if not saves or self._kv is None:	# none, or the Client went meanwhile
                return
            L = len(self._caches)
            i = 0
            while i < L:	# the runs of layers not saved yet, one call each
                if i in done:
                    i += 1
                    continue
                j = i
                while j < L and j not in done:
                    j += 1
                self._save_layers(i, j - i)
                i = j
            self._gpu.saves_wait()
            for r, hits, ids, sv in saves:
                if r is None:
                    continue
                try:
                    r.publish()
                except KvcError as e:
                    log.warning("kvcached: saving %s: %s", sv.req_id, e)
        finally:
            for r, *_ in saves:
                if r is not None:
                    try:
                        r.release()
                    except KvcError:
                        pass
            self._saves = None

    def wait_for_save(self) -> None:
        """Scatter the prompt blocks computed in this step into kvcached
        pages and publish them (blocks already cached are skipped)."""
        self.wait_for_layer_load("")
        self._loads_finished()
        self._release_loads()
        if self._gpu is not None:
            self._finish_gpu_saves()
            self._say_status()
            return
        meta = self._get_connector_metadata()
        # No-insert, or another rank writes our heads: nothing to save.
        if not meta.saves or self.no_insert or not self.model.writes:
            return
        c = self._client()
        if c is None:
            return
        for sv in meta.saves:
            try:
                with c.request(sv.tokens, extra=sv.extra) as r:
                    hits = r.lookup()
                    if hits >= r.blocks:
                        continue
                    got = r.alloc()
                    if not got:
                        continue	# pool full of pinned pages: try another time
                    if self._kv is not None:
                        r.scatter(self._kv, self._engine_ids(sv.block_ids, hits, got))
                    else:
                        pages = self._page_views(r, hits, got)
                        segs = self._segments(sv.block_ids, hits, got)
                        for layer in range(len(self._caches)):
                            self._copy_layer(pages, segs, layer, False)
                    r.publish()
            except NoInsertError as e:
                read_only("KvcachedConnector", e, log)
                self.no_insert = True
                return
            except KvcError as e:
                if not c.connected():
                    self._drop_client(str(e))
                    return
                log.warning("kvcached: saving %s: %s", sv.req_id, e)

    def _say_status(self) -> None:
        """A host pool's registration that failed part way: said once."""
        if "gpu" in self._said or self._kv is None or self._rc.c is None:
            return
        c = self._rc.c
        if c.pool_kind != "host":
            return
        st = c.gpu_status()
        if st["state"] == "failed":
            self._say_once("gpu", "kvcached: %s of %s chunks of the host pool registered "
                           "with CUDA (%s): pages of the others are copied piece by piece, "
                           "far below the bus's speed", st["chunks_registered"],
                           st["chunks"], st["why"])

    def get_finished(self, finished_req_ids: Any) -> tuple[Optional[set], Optional[set]]:
        return None, None	# loads and saves finish within their step

    def get_block_ids_with_load_errors(self) -> set:
        errs, self._load_errors = self._load_errors, set()
        return errs

    def shutdown(self) -> None:
        self.wait_for_layer_load("")
        self._loads_finished()
        self._release_loads()
        self._rc.close()
