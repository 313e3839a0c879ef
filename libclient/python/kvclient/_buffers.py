# SPDX-License-Identifier: MIT
"""Turning Python objects into what the C calls take, without a Python
loop over tokens or blocks, and dtypes into numpy / torch dtypes.

Integer sequences (prompt tokens as uint32, engine block ids as int64):

* zero-copy, the buffer's own address is passed: ``array.array`` of the
  right width, a C-contiguous one-dimensional ``numpy.ndarray`` of
  uint32/int32 (tokens) or int64 (ids), a contiguous one-dimensional CPU
  ``torch.Tensor`` of int32 (tokens) or int64 (ids);
* converted in one C-level step otherwise: a list, tuple, range or any
  iterable of ints (``array.array(typecode, seq)``), arrays and tensors of
  other integer dtypes (one ``astype`` / ``to``, after a range check).

numpy and torch are optional: they are recognised by their type's module
and imported only when such an object is passed.
"""
from __future__ import annotations

import array
import ctypes
import sys
from typing import Any, Callable, Dict, Optional, Tuple

from .errors import TensorError, TensorDeviceError

# What a converter answers: (address or None, count, the object that keeps
# the memory alive while C reads it).
Converted = Tuple[Optional[int], int, Any]
Conv = Callable[[Any], Converted]

_c_char = ctypes.c_char
_addressof = ctypes.addressof


# ------------------------------------------------------------------ dtypes

# Canonical dtype names (numpy / torch spelling) and their sizes.
DTYPE_BYTES = {
    "float16": 2, "bfloat16": 2, "float32": 4, "float64": 8,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "int8": 1, "uint8": 1,
}
_ALIASES = {
    "fp16": "float16", "half": "float16", "f16": "float16",
    "bf16": "bfloat16",
    "fp32": "float32", "float": "float32", "f32": "float32",
    "fp64": "float64", "double": "float64",
    "fp8": "float8_e4m3fn", "fp8_e4m3": "float8_e4m3fn", "float8_e4m3": "float8_e4m3fn",
    "fp8_e5m2": "float8_e5m2",
}
# numpy lacks these; a page of them is viewed as raw integers of their width.
_NP_RAW = {"bfloat16", "float8_e4m3fn", "float8_e5m2"}


def parse_dtype(dtype: Any) -> tuple[str | None, int]:
    """(canonical name or None, bytes) of a dtype given as a name, a numpy
    or torch dtype, or a plain number of bytes."""
    if isinstance(dtype, bool):
        raise TypeError("dtype: a name, a numpy or torch dtype, or a number of bytes")
    if isinstance(dtype, int):
        if dtype not in (1, 2, 4, 8):
            raise ValueError(f"dtype of {dtype} bytes: must be 1, 2, 4 or 8")
        return None, dtype
    mod = type(dtype).__module__ or ""
    if isinstance(dtype, str):
        name = dtype.lower()
        for prefix in ("torch.", "numpy.", "np."):
            if name.startswith(prefix):
                name = name[len(prefix):]
    elif mod.startswith("torch"):
        name = str(dtype).split(".")[-1]
    elif mod.startswith("numpy") or (isinstance(dtype, type) and
                                     (dtype.__module__ or "").startswith("numpy")):
        import numpy
        name = numpy.dtype(dtype).name
    else:
        raise TypeError(f"dtype {dtype!r}: a name, a numpy or torch dtype, or a number "
                        f"of bytes")
    name = _ALIASES.get(name, name)
    if name not in DTYPE_BYTES:
        raise ValueError(f"dtype {dtype!r}: not a KV dtype this package knows "
                         f"({', '.join(sorted(DTYPE_BYTES))}); pass its size in bytes "
                         f"to use raw pages")
    return name, DTYPE_BYTES[name]


def numpy_dtype(name: str | None, nbytes: int) -> Any:
    """The numpy dtype of a page's elements (raw unsigned ints if numpy lacks it)."""
    import numpy
    if name is None or name in _NP_RAW:
        return numpy.dtype(f"uint{8 * nbytes}")
    return numpy.dtype(name)


_TORCH_RAW = {1: "uint8", 2: "int16", 4: "int32", 8: "int64"}


def torch_dtype(name: str | None, nbytes: int) -> Any:
    """The torch dtype of a page's elements (raw ints if this torch lacks it)."""
    import torch
    t = getattr(torch, name, None) if name else None
    return t if t is not None else getattr(torch, _TORCH_RAW[nbytes])


def _dtype_matches(model_name: str | None, nbytes: int, t_name: str, t_bytes: int,
                   t_integer: bool, lib: str) -> bool:
    if t_bytes != nbytes:
        return False
    if model_name is None:
        return True	# raw pages: any element type of that width
    if t_name == model_name:
        return True
    # A dtype the tensor library lacks travels as raw integers of its width.
    if not t_integer:
        return False
    if lib == "numpy":
        return model_name in _NP_RAW
    import torch
    return getattr(torch, model_name, None) is None


# ---------------------------------------------------- integer sequences

def _seq(typecode: str, what: str) -> Conv:
    """Converter of any sequence of ints to an array.array of typecode."""
    def conv(seq: Any) -> Converted:
        try:
            a = array.array(typecode, seq)
        except OverflowError:
            raise TensorError(22, what) from None
        addr, n = a.buffer_info()
        return addr, n, a
    return conv


def _array(typecodes: str, itemsize: int, seq: Conv) -> Conv:
    """Converter of an array.array: by address when its items already are
    integers of that width, else through seq."""
    def conv(a: Any) -> Converted:
        if a.itemsize == itemsize and a.typecode in typecodes:
            addr, n = a.buffer_info()
            return addr, n, a
        return seq(a)
    return conv


_seq_u32 = _seq("I", "token ids must be integers in 0..2**32-1")
_seq_i64 = _seq("q", "engine block ids must fit in a signed 64-bit integer")
_array_u32 = _array("IiLl", 4, _seq_u32)
_array_i64 = _array("qlL", 8, _seq_i64)


def _np_addr(a: Any) -> Tuple[Optional[int], Any]:
    """Address of a C-contiguous numpy array, pinning its buffer while the
    returned keep-alive object lives; None if it is read-only or strided."""
    if not a.size:
        return None, None
    try:
        x = _c_char.from_buffer(a)
    except (TypeError, ValueError, BufferError):
        return None, None
    return _addressof(x), x


def _np_convert(a: Any, np_dtype: Any, lo: int, hi: int, what: str) -> Converted:
    import numpy
    if a.ndim != 1:
        raise TensorError(22, f"{what} must be one-dimensional, got shape {tuple(a.shape)}")
    if a.dtype.kind not in "iu":
        raise TensorError(22, f"{what} must be integers, got dtype {a.dtype}")
    if a.size and (int(a.min()) < lo or int(a.max()) > hi):
        raise TensorError(22, f"{what} must be integers in {lo}..{hi}")
    b = numpy.ascontiguousarray(a, dtype=np_dtype)
    addr, keep = _np_addr(b)
    if addr is None and b.size:
        b = b.copy()	# read-only source: a writable copy
        addr, keep = _np_addr(b)
    return addr, b.size, (b, keep)


def _make_np(kind: str) -> Conv:
    import numpy
    ok = ((numpy.dtype("uint32"), numpy.dtype("int32")) if kind == "u32"
          else (numpy.dtype("int64"),))
    np_dtype, lo, hi, what = ((numpy.uint32, 0, 2**32 - 1, "token ids") if kind == "u32"
                              else (numpy.int64, -2**63, 2**63 - 1, "engine block ids"))

    def conv(a: Any) -> Converted:
        if a.dtype in ok and a.ndim == 1:
            addr, keep = _np_addr(a)
            if addr is not None or not a.size:
                return addr, a.size, keep
        return _np_convert(a, np_dtype, lo, hi, what)
    return conv


def _make_torch(kind: str) -> Conv:
    import torch
    want = torch.int32 if kind == "u32" else torch.int64
    lo, hi = (0, 2**32 - 1) if kind == "u32" else (-2**63, 2**63 - 1)
    what = "token ids" if kind == "u32" else "engine block ids"

    def conv(t: Any) -> Converted:
        if t.dtype is want and t.dim() == 1 and t.device.type == "cpu" and t.is_contiguous():
            return t.data_ptr(), t.numel(), t
        if t.dim() != 1:
            raise TensorError(22, f"{what} must be one-dimensional, got shape {tuple(t.shape)}")
        if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype is torch.bool:
            raise TensorError(22, f"{what} must be integers, got dtype {t.dtype}")
        if t.device.type == "meta":
            raise TensorDeviceError(22, f"{what} on the meta device hold no values")
        t = t.detach().to("cpu")
        if t.numel() and (int(t.min()) < lo or int(t.max()) > hi):
            raise TensorError(22, f"{what} must be integers in {lo}..{hi}")
        # int64 values up to 2**32-1 become int32 of the same low 32 bits,
        # which is what the C side reads as uint32.
        t = t.to(torch.int64).to(want).contiguous() if kind == "u32" else t.to(want).contiguous()
        return t.data_ptr(), t.numel(), t
    return conv


def _memoryview_conv(kind: str) -> Conv:
    seq = _seq_u32 if kind == "u32" else _seq_i64

    def conv(m: Any) -> Converted:
        m = memoryview(m)
        if m.ndim != 1:
            raise TensorError(22, "a one-dimensional buffer of integers is needed")
        return seq(m)
    return conv


# type -> converter, filled as types are seen (numpy / torch without importing them
# up front). Bytes and str are refused: they are not integer sequences.
_U32: Dict[type, Conv] = {list: _seq_u32, tuple: _seq_u32, range: _seq_u32, array.array: _array_u32}
_I64: Dict[type, Conv] = {list: _seq_i64, tuple: _seq_i64, range: _seq_i64, array.array: _array_i64}


def _converter(table: Dict[type, Conv], obj: Any, kind: str) -> Conv:
    t = type(obj)
    mod = t.__module__ or ""
    if t in (bytes, bytearray, str):
        raise TypeError(f"a sequence of integers is needed, not {t.__name__}")
    if mod == "numpy" and t.__name__ == "ndarray":
        fn = _make_np(kind)
    elif mod.startswith("torch") and "torch" in sys.modules and \
            isinstance(obj, sys.modules["torch"].Tensor):
        fn = _make_torch(kind)
    elif t is memoryview:
        fn = _memoryview_conv(kind)
    else:
        fn = _seq_u32 if kind == "u32" else _seq_i64	# any iterable of ints
        return fn
    table[t] = fn
    return fn


def u32(obj: Any) -> Converted:
    """(address or None, count, keep-alive) of token ids as uint32."""
    fn = _U32.get(type(obj)) or _converter(_U32, obj, "u32")
    return fn(obj)


def i64(obj: Any) -> Converted:
    """(address or None, count, keep-alive) of engine block ids as int64."""
    fn = _I64.get(type(obj)) or _converter(_I64, obj, "i64")
    return fn(obj)


# ---------------------------------------------------------------- tensors

class TensorInfo:
    """What gather/scatter need to know of a numpy array or torch tensor."""

    __slots__ = ("ptr", "shape", "strides", "itemsize", "dtype", "integer", "device",
                 "index", "writable", "lib")

    def __init__(self, t: Any, what: str) -> None:
        mod = type(t).__module__ or ""
        if "torch" in sys.modules and isinstance(t, sys.modules["torch"].Tensor):
            self.lib = "torch"
            self.device = t.device.type
            self.index = t.device.index
            self.ptr = t.data_ptr() if self.device != "meta" else 0
            self.shape = tuple(t.shape)
            self.strides = tuple(t.stride())
            self.itemsize = t.element_size()
            self.dtype = str(t.dtype).split(".")[-1]
            self.integer = not (t.dtype.is_floating_point or t.dtype.is_complex)
            self.writable = True
        elif mod == "numpy" and type(t).__name__ == "ndarray":
            self.lib = "numpy"
            self.device = "cpu"
            self.index = None
            self.ptr = t.ctypes.data
            self.shape = tuple(t.shape)
            self.itemsize = t.itemsize
            if any(s % t.itemsize for s in t.strides):
                raise TensorError(22, f"{what}: strides {t.strides} are not whole elements")
            self.strides = tuple(s // t.itemsize for s in t.strides)
            self.dtype = t.dtype.name
            self.integer = t.dtype.kind in "iu"
            self.writable = bool(t.flags.writeable)
        else:
            raise TypeError(f"{what}: a torch.Tensor or numpy.ndarray is needed, not "
                            f"{type(t).__name__}")
