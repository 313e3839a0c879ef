# SPDX-License-Identifier: MIT
"""PagedKV: an engine's paged KV tensors checked once against a Client's
model and pool; the struct kvc_layout every gather and scatter is handed.
"""
from __future__ import annotations

import ctypes
import errno as _errno
from ctypes import c_void_p
from typing import TYPE_CHECKING, Any

from . import _buffers as _b
from . import _lib as _L
from .errors import DeviceMemoryError, TensorDeviceError, TensorError, WrongDeviceError

# The module, not the class: client.py imports request.py, which imports
# this file, before Client exists.
from . import client as _client

if TYPE_CHECKING:
    from .client import Client


class PagedKV:
    """An engine's paged KV cache, checked once against a Client's model and
    pool, for Request.gather() and Request.scatter().

    ``layout="flash"`` (vLLM's FlashAttention layout): ``k`` is a sequence of
    one tensor per layer, each [2, num_blocks, block_tokens, kv_heads,
    head_dim] (K then V), or one tensor [layers, 2, num_blocks, ...].
    ``layout="kv"``: ``k`` and ``v`` are each a sequence of one tensor per
    layer, [num_blocks, block_tokens, kv_heads, head_dim], or one tensor
    [layers, num_blocks, ...]. ``layout="mla"`` (an MLA model; vLLM's MLA
    cache): ``k`` is a sequence of one latent tensor per layer, each
    [num_blocks, block_tokens, head_dim], or one tensor [layers,
    num_blocks, ...]. kv_heads is this rank's count (``model.heads``):
    gather and scatter move only its heads of each page. The layout
    defaults to "kv" when ``v`` is given, "mla" for an MLA model, else
    "flash".

    torch tensors or numpy arrays of the model's dtype; within a block dense,
    between blocks any stride (padding) the same for every tensor; the
    pool's GPU for a cuda pool; for a host pool either CPU memory (copies on
    the calling thread) or one GPU, all tensors on it (a GPU engine: the
    pool is registered with CUDA for that GPU, Client.gpu_prepare, and the
    copies run there as kernels; NotSupportedError says why where that
    cannot be). Anything else raises TensorError / TensorDeviceError here,
    before any copy. The tensors are referenced, not copied: keep using
    them.
    """

    def __init__(self, client: Client, k: Any, v: Any = None, *, layout: str | None = None) -> None:
        if not isinstance(client, _client.Client):
            raise TypeError("client must be a kvclient.Client")
        client._handle()
        m = client.model
        layout = layout or ("kv" if v is not None else "mla" if m.mla else "flash")
        if layout not in ("kv", "flash", "mla"):
            raise ValueError(f"layout {layout!r}: 'kv', 'flash' or 'mla'")
        if layout != "kv" and v is not None:
            raise ValueError(f"layout {layout!r} keeps a layer's KV in one tensor: no v")
        if layout == "kv" and v is None:
            raise ValueError("layout 'kv' needs v, the V tensors")
        if (layout == "mla") != m.mla:
            raise ValueError(f"layout {layout!r} for a model {'with' if m.mla else 'without'}"
                             " MLA: " + ("'mla'" if m.mla else "'kv' or 'flash'"))
        self.layout = layout
        self.layers = m.layers
        self._geom = client._geom
        self._pool = (client.pool_kind, client.pool_device)
        lead = (2,) if layout == "flash" else ()
        ks, kinfo = self._tensors(client, k, "k", lead)
        if layout == "kv":
            vs, vinfo = self._tensors(client, v, "v", lead)
        else:
            vs, vinfo = [], []
        infos = kinfo + vinfo
        self.num_blocks: int = infos[0][1].shape[len(lead)]
        stride = infos[0][1].strides[len(lead)]
        for what, t in infos:
            if t.shape[len(lead)] != self.num_blocks:
                raise TensorError(_errno.EINVAL, f"{what}: {t.shape[len(lead)]} blocks, "
                                  f"{infos[0][0]} has {self.num_blocks}")
            if t.strides[len(lead)] != stride:
                raise TensorError(_errno.EINVAL, f"{what}: block stride {t.strides[len(lead)]}"
                                  f" elements, {infos[0][0]} has {stride}: one stride for all")
        #: bytes from one block to the next in each tensor
        self.block_stride: int = stride * m.dtype_bytes
        self._torch = infos[0][1].lib == "torch"
        #: the CUDA device the copies run on, None for CPU copies
        self.device: int | None = client.pool_device
        gpu = infos[0][1].device == "cuda"
        if client.pool_kind == "host":
            self.device = (infos[0][1].index or 0) if gpu else None
            for what, t in infos:
                if (t.device == "cuda") != gpu or (gpu and (t.index or 0) != self.device):
                    raise TensorDeviceError(_errno.EINVAL, f"{what} is on {t.device}"
                                            f"{':' + str(t.index) if t.index is not None else ''}"
                                            f", {infos[0][0]} on {infos[0][1].device}: "
                                            "every tensor in one place")
        kp = (c_void_p * m.layers)(*ks)
        vp = (c_void_p * m.layers)(*vs) if vs else None
        lay = _L.Layout()
        lay.size = ctypes.sizeof(lay)
        lay.kind = {"flash": _L.LAYOUT_FLASH, "kv": _L.LAYOUT_KV, "mla": _L.LAYOUT_MLA}[layout]
        lay.layers = m.layers
        lay.num_blocks = self.num_blocks
        lay.block_stride = self.block_stride
        lay.k = kp
        if vp is not None:
            lay.v = vp
        if client.pool_kind == "host" and self.device is not None:
            lay.flags = _L.LAYOUT_DEVICE
            lay.device = self.device
            client.gpu_prepare(self.device)	# registers the pool, off the request path
        self._layout = lay
        self._keep = (k, v, kp, vp)

    def _tensors(self, client: Client, x: Any, name: str,
                 lead: tuple) -> tuple[list[int], list[tuple[str, Any]]]:
        """Per-layer start addresses and infos of `x` (a sequence of one tensor
        per layer, or one tensor with a leading layers dimension)."""
        m = client.model
        if m.mla:
            inner: tuple[int, ...] = (m.block_tokens, m.head_dim)
            names = ["block_tokens", "head_dim"]
        else:
            inner = (m.block_tokens, m.heads[1], m.head_dim)
            names = ["block_tokens", "kv_heads", "head_dim"]
        want = "[" + ", ".join(["2"] * len(lead) + ["num_blocks"] + names) + "]"
        if isinstance(x, (list, tuple)):
            if len(x) != m.layers:
                raise TensorError(_errno.EINVAL, f"{name}: {len(x)} tensors for a model of "
                                  f"{m.layers} layers: one per layer")
            infos = [(f"{name}[{i}]", _b.TensorInfo(t, f"{name}[{i}]")) for i, t in enumerate(x)]
            for what, t in infos:
                self._check(client, what, t, lead, inner, want)
            return [t.ptr for _, t in infos], infos
        t = _b.TensorInfo(x, name)
        if len(t.shape) != len(lead) + 2 + len(inner) or t.shape[0] != m.layers:
            raise TensorError(_errno.EINVAL, f"{name}: shape {t.shape}, want one tensor per "
                              f"layer {want} or [layers={m.layers}] + {want}")
        sub = _b.TensorInfo.__new__(_b.TensorInfo)
        for f in _b.TensorInfo.__slots__:
            setattr(sub, f, getattr(t, f))
        sub.shape, sub.strides = t.shape[1:], t.strides[1:]
        self._check(client, name, sub, lead, inner, want)
        step = t.strides[0] * t.itemsize
        return [t.ptr + i * step for i in range(m.layers)], [(name, sub)]

    @staticmethod
    def _check(client: Client, what: str, t: "_b.TensorInfo", lead: tuple, inner: tuple,
               want: str) -> None:
        m = client.model
        if client.pool_kind == "host":
            if t.device not in ("cpu", "cuda"):
                raise TensorDeviceError(_errno.EINVAL, f"{what} is on {t.device}: the pool is"
                                        " host memory, gather/scatter take CPU or CUDA tensors")
        elif t.device != "cuda":
            raise DeviceMemoryError(_errno.EFAULT, f"{what} is on {t.device}: the pool is on "
                                    f"cuda:{client.pool_device}")
        elif t.index != client.pool_device:
            raise WrongDeviceError(_errno.EXDEV, f"{what} is on cuda:{t.index}: the pool is "
                                   f"on cuda:{client.pool_device}")
        if not _b._dtype_matches(m.dtype, m.dtype_bytes, t.dtype, t.itemsize, t.integer,
                                 t.lib):
            raise TensorError(_errno.EINVAL, f"{what}: dtype {t.dtype} ({t.itemsize} bytes), "
                              f"the model's is {m.dtype or f'{m.dtype_bytes} bytes'}")
        if not t.writable:
            raise TensorError(_errno.EINVAL, f"{what} is read-only; gather writes into it")
        n = len(lead)
        names = want[1:-1].split(", ")[n + 1:]
        if len(t.shape) != n + 1 + len(inner) or t.shape[:n] != lead or t.shape[n + 1:] != inner:
            heads = (f" ({inner[1]}: this rank's KV heads, {m.heads[0]}.."
                     f"{m.heads[0] + m.heads[1] - 1} of the model's {m.kv_heads})"
                     if len(inner) == 3 and m.heads[1] != m.kv_heads else "")
            raise TensorError(_errno.EINVAL, f"{what}: shape {t.shape}, want {want} with "
                              f"{', '.join(names)} = {inner}{heads}")
        s = t.strides
        dense: list[int] = []
        block = 1
        for size in reversed(inner):
            dense.insert(0, block)
            block *= size
        if any(size > 1 and st != d for size, st, d in zip(inner, s[n + 1:], dense)):
            raise TensorError(_errno.EINVAL, f"{what}: strides {s}: a block must be dense "
                              f"[{', '.join(names)}]")
        if s[n] < block:
            raise TensorError(_errno.EINVAL, f"{what}: block stride {s[n]} elements, smaller "
                              f"than a block ({block})")
        if n and s[0] != t.shape[1] * s[1]:
            raise TensorError(_errno.EINVAL, f"{what}: V must start right after K's "
                              f"num_blocks blocks (stride of the K/V dimension {s[0]}, want "
                              f"{t.shape[1] * s[1]})")
        if not t.ptr:
            raise TensorError(_errno.EINVAL, f"{what}: no data (an empty tensor)")

    def __repr__(self) -> str:
        return (f"<kvclient.PagedKV {self.layout} {self.layers} layers x {self.num_blocks} "
                f"blocks>")
