# SPDX-License-Identifier: MIT
"""Model: a model geometry and identity, its namespace (struct kvc_model).
"""
from __future__ import annotations

import ctypes
import enum
from typing import Any

from . import _buffers as _b
from . import _lib as _L
from ._ccall import _u


class PosKind(enum.IntEnum):
    """How positions are encoded (enum kvc_pos_kind); part of the namespace."""
    NONE = 0
    ROPE = 1
    ALIBI = 2
    LEARNED = 3


class Model:
    """A model geometry and identity: its namespace (struct kvc_model).

    KV never crosses namespaces: clients hit each other's blocks only when
    name, dtype size, layers, kv_heads, head_dim, block_tokens, position
    kind, MLA or not, key kind and pipeline stage are all equal (the
    tensor-parallel rank and size are not part of it). Note that the namespace knows the dtype's
    size, not its kind: name the revision and precision in ``name``
    ("llama-3-8b@main/bf16") so that float16 and bfloat16 KV of one model
    stay apart.

    ``dtype``: a name ("float16", "bf16", "float32", "fp8", ...), a numpy or
    torch dtype, or a number of bytes (1, 2, 4, 8) for raw pages. The shard
    (``tp_rank``/``tp_size``, ``pp_rank``/``pp_size``) says which part of a
    model parallelised across processes this client holds; the defaults
    (0 of 1) mean not sharded. ``kv_heads`` are the model's, every
    tensor-parallel rank's together: the ranks of any TP size share the
    namespace and its pages (a page holds every head), each moving its
    own heads (``heads``; ``writes`` says whether this rank publishes
    them or, holding replicated heads, only reads them). A pipeline stage
    declares its own ``layers`` and has its own pages.

    ``mla=True`` (KVC_MODEL_MLA): multi-head latent attention (DeepSeek,
    Kimi K2): one latent vector of ``head_dim`` elements (kv_lora_rank +
    rope dims) per token per layer, no K and V, ``kv_heads`` 1. Every
    tensor-parallel rank holds all of it; rank 0 publishes, all read.

    ``keys="engine"`` (KVC_MODEL_ENGINE_KEYS) declares a namespace whose
    blocks the engine names by keys of its own (SGLang's page hashes):
    requests come from ``Client.request_keys``, never from tokens, and a
    hit is only as exact as the engine's key. Such a namespace never shares
    blocks with the token-keyed one of the same model.
    """

    __slots__ = ("name", "dtype", "dtype_bytes", "layers", "kv_heads", "head_dim",
                 "block_tokens", "pos", "tp_rank", "tp_size", "pp_rank", "pp_size", "keys",
                 "mla")

    def __init__(self, name: str, dtype: Any, layers: int, kv_heads: int, head_dim: int,
                 block_tokens: int, pos: PosKind | str | int = PosKind.ROPE, *,
                 tp_rank: int = 0, tp_size: int = 1, pp_rank: int = 0, pp_size: int = 1,
                 keys: str = "tokens", mla: bool = False) -> None:
        if not isinstance(name, str):
            raise TypeError("name must be a str")
        if not 1 <= len(name.encode()) <= 63 or "\0" in name:
            raise ValueError(f"model name {name!r}: must be 1..63 bytes of UTF-8, no NUL")
        self.name = name
        self.dtype, self.dtype_bytes = _b.parse_dtype(dtype)
        self.layers = _u("layers", layers, 1, 4096)
        self.kv_heads = _u("kv_heads", kv_heads, 1, 4096)
        self.head_dim = _u("head_dim", head_dim, 1, 65536)
        self.block_tokens = _u("block_tokens", block_tokens, 1, 2**32 - 1)
        if isinstance(pos, str):
            try:
                pos = PosKind[pos.upper()]
            except KeyError:
                raise ValueError(f"pos {pos!r}: one of none, rope, alibi, learned") from None
        self.pos = PosKind(pos)
        self.tp_size = _u("tp_size", tp_size, 0, 65535)
        self.tp_rank = _u("tp_rank", tp_rank, 0, max(self.tp_size - 1, 0))
        self.pp_size = _u("pp_size", pp_size, 0, 65535)
        self.pp_rank = _u("pp_rank", pp_rank, 0, max(self.pp_size - 1, 0))
        if keys not in ("tokens", "engine"):
            raise ValueError(f"keys {keys!r}: 'tokens' (kvcached keys blocks by their tokens)"
                             " or 'engine' (the engine names each block)")
        self.keys = keys
        self.mla = bool(mla)
        if self.mla and self.kv_heads != 1:
            raise ValueError(f"kv_heads {self.kv_heads}: an MLA model has one latent vector "
                             "per token and layer: kv_heads=1")
        self._part()	# tp_size and kv_heads must split evenly

    def _part(self) -> tuple[int, int, bool]:
        """(first head, heads, writes) of this rank: kvproto_part in shm/proto.c."""
        tp, r, h = max(self.tp_size, 1), self.tp_rank, self.kv_heads
        if self.mla:
            return 0, 1, r == 0
        if tp <= h:
            if h % tp:
                raise ValueError(f"tp_size {tp} does not divide the model's {h} KV heads "
                                 "(kv_heads counts every tensor-parallel rank's)")
            if tp > 32:
                raise ValueError(f"tp_size {tp}: at most 32 ranks write one page")
            return r * (h // tp), h // tp, True
        if tp % h:
            raise ValueError(f"the model's {h} KV heads do not divide tp_size {tp}")
        if h > 32:
            raise ValueError(f"{h} KV heads replicated: at most 32 ranks write one page")
        rep = tp // h
        return r // rep, 1, r % rep == 0

    @property
    def heads(self) -> tuple[int, int]:
        """(first, count): the KV heads of a page this rank holds and moves."""
        return self._part()[:2]

    @property
    def writes(self) -> bool:
        """Does this rank publish its heads (False: another rank of its engine
        writes them: replicated heads, an MLA rank other than 0)?"""
        return self._part()[2]

    @property
    def page_shape(self) -> tuple:
        """Shape of one block's page: [layers, 2 (K, V), block_tokens, kv_heads,
        head_dim] with every KV head of the model, or [layers, block_tokens,
        head_dim] for MLA."""
        if self.mla:
            return (self.layers, self.block_tokens, self.head_dim)
        return (self.layers, 2, self.block_tokens, self.kv_heads, self.head_dim)

    @property
    def page_bytes(self) -> int:
        """Bytes of one block's page."""
        return (self.block_tokens * self.layers * (1 if self.mla else 2) * self.kv_heads *
                self.head_dim * self.dtype_bytes)

    def _struct(self) -> _L.ModelStruct:
        m = _L.ModelStruct()
        m.size = ctypes.sizeof(m)
        m.flags = ((_L.MODEL_ENGINE_KEYS if self.keys == "engine" else 0) |
                   (_L.MODEL_MLA if self.mla else 0))
        m.name = self.name.encode()
        m.dtype_bytes = self.dtype_bytes
        m.layers = self.layers
        m.kv_heads = self.kv_heads
        m.head_dim = self.head_dim
        m.block_tokens = self.block_tokens
        m.pos_kind = int(self.pos)
        m.shard.tp_rank, m.shard.tp_size = self.tp_rank, self.tp_size
        m.shard.pp_rank, m.shard.pp_size = self.pp_rank, self.pp_size
        return m

    def _geometry(self) -> tuple:
        return (self.dtype, self.dtype_bytes, self.layers, self.kv_heads, self.head_dim,
                self.block_tokens, self.mla, self.heads)

    def __repr__(self) -> str:
        shard = ""
        if self.tp_size > 1:
            shard += f", tp_rank={self.tp_rank}, tp_size={self.tp_size}"
        if self.pp_size > 1:
            shard += f", pp_rank={self.pp_rank}, pp_size={self.pp_size}"
        if self.keys != "tokens":
            shard += f", keys={self.keys!r}"
        if self.mla:
            shard += ", mla=True"
        return (f"Model({self.name!r}, {self.dtype or self.dtype_bytes!r}, layers={self.layers}"
                f", kv_heads={self.kv_heads}, head_dim={self.head_dim}, block_tokens="
                f"{self.block_tokens}, pos={self.pos.name.lower()!r}{shard})")
