# SPDX-License-Identifier: MIT
"""The ctypes mirror against the header it mirrors: libclient/kvclient.h is
parsed (comments and preprocessor lines dropped), and

- every struct of the header has its mirror in kvclient/_lib.py's
  C_STRUCTS, with the same fields in the same order, each of a ctypes type
  that is the C type (a pointer may be c_void_p; char * and void * may be
  c_char_p);
- every function of the header has a prototype in _lib._PROTOS, or is in
  _lib.NOT_BOUND with the reason; its restype and argtypes match the
  header's return and parameter types the same way, and _PROTOS names no
  function the header lacks;
- _kvcfast.c's typedefs of kvc_req_new, kvc_lookup and kvc_req_free have
  the header's parameter and return types (kvc_t and struct kvc_req as
  void).

(tests/python/test_api.py holds the same structs to the compiler's sizes
and offsets.) A mismatch names the struct or function, the field or
parameter, and both types.
"""
from __future__ import annotations

import ctypes
import re
from pathlib import Path
from typing import Any, Dict, List, Tuple

from kvclient import _lib

ROOT = Path(__file__).resolve().parents[2]
HEADER = ROOT / "libclient" / "kvclient.h"
FAST = ROOT / "libclient" / "python" / "kvclient" / "_kvcfast.c"

SCALARS: Dict[str, Any] = {
    "uint16_t": ctypes.c_uint16, "uint32_t": ctypes.c_uint32, "uint64_t": ctypes.c_uint64,
    "int32_t": ctypes.c_int32, "int64_t": ctypes.c_int64, "int": ctypes.c_int,
    "size_t": ctypes.c_size_t, "double": ctypes.c_double, "char": ctypes.c_char,
}
OPAQUE = {"kvc_t", "struct kvc_req", "struct kvc"}


def strip_c(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    lines, cont = [], False
    for line in text.splitlines():
        if cont or line.lstrip().startswith("#"):
            cont = line.rstrip().endswith("\\")
            continue
        lines.append(line)
    return "\n".join(lines)


def split_decl(decl: str) -> Tuple[str, int, str, int]:
    """'const uint32_t *const *tokens[3]' -> ('uint32_t', 2, 'tokens', 3)."""
    decl = " ".join(decl.replace("*", " * ").split())
    m = re.match(r"^(.*?)\s*(\w+)\s*(?:\[\s*(\d+)\s*\])?$", decl)
    assert m, f"kvclient.h: cannot read declaration {decl!r}"
    typ, name, n = m.group(1), m.group(2), int(m.group(3) or 0)
    words = [w for w in typ.split() if w != "const"]
    stars = words.count("*")
    base = " ".join(w for w in words if w != "*")
    return base, stars, name, n


def header() -> Tuple[Dict[str, List[Tuple[str, int, str, int]]],
                      Dict[str, Tuple[Tuple[str, int], List[Tuple[str, int]]]]]:
    src = strip_c(HEADER.read_text())
    structs = {}
    for name, body in re.findall(r"\bstruct (\w+) \{(.*?)\};", src, re.S):
        structs[name] = [split_decl(f) for f in body.split(";") if f.strip()]
    funcs = {}
    for ret, name, args in re.findall(r"^([A-Za-z_][\w \*]*?[\s\*])(kvc_\w+)\(([^)]*)\);",
                                      src, re.M | re.S):
        b, s, _, _ = split_decl(ret.strip() + " x")
        params = []
        for a in args.split(","):
            a = " ".join(a.split())
            if a and a != "void":
                pb, ps, _, _ = split_decl(a)
                params.append((pb, ps))
        funcs[name] = ((b, s), params)
    assert len(structs) >= 9 and len(funcs) >= 40, \
        f"kvclient.h: parsed only {len(structs)} structs, {len(funcs)} functions"
    return structs, funcs


def accepts(base: str, stars: int, n: int, ct: Any) -> bool:
    """Is ctypes type ct the C type base + stars * '*' (+ [n])?"""
    if n:
        return (isinstance(ct, type) and issubclass(ct, ctypes.Array) and ct._length_ == n and
                accepts(base, stars, 0, ct._type_))
    if stars == 0:
        if base == "void":
            return ct is None
        if base.startswith("struct "):
            return ct is _lib.C_STRUCTS.get(base[7:])
        return ct is SCALARS.get(base)
    if ct is ctypes.c_void_p:
        return True
    if stars == 1 and base in ("char", "void") and ct is ctypes.c_char_p:
        return True	# void *: bytes handed as they are
    if base in OPAQUE and stars == 1:
        return False	# an opaque handle is c_void_p, nothing else
    if isinstance(ct, type) and issubclass(ct, ctypes._Pointer):
        inner = ct._type_
        if base in OPAQUE and stars == 2:
            return inner is ctypes.c_void_p
        if stars >= 2 and inner is ctypes.c_void_p:
            return base == "void" or base in OPAQUE or stars == 2
        return accepts(base, stars - 1, 0, inner)
    return False


def show(base: str, stars: int, n: int = 0) -> str:
    return base + " " + "*" * stars + (f"[{n}]" if n else "")


def test_structs_match() -> None:
    structs, _ = header()
    missing = sorted(set(structs) - set(_lib.C_STRUCTS))
    assert not missing, f"kvclient.h: struct {missing} has no mirror in _lib.C_STRUCTS"
    stale = sorted(set(_lib.C_STRUCTS) - set(structs))
    assert not stale, f"_lib.C_STRUCTS mirrors {stale}, which kvclient.h does not declare"
    for name, fields in structs.items():
        py = _lib.C_STRUCTS[name]._fields_
        cn = [f[2] for f in fields]
        pn = [f[0] for f in py]
        assert cn == pn, f"struct {name}: kvclient.h fields {cn}, _lib.py {pn}"
        for (base, stars, fname, n), (_, ct) in zip(fields, py):
            assert accepts(base, stars, n, ct), \
                f"struct {name}.{fname}: kvclient.h {show(base, stars, n)}, _lib.py {ct!r}"


def test_prototypes_match() -> None:
    _, funcs = header()
    protos = {p[0]: p for p in _lib._PROTOS}
    stale = sorted(set(protos) - set(funcs))
    assert not stale, f"_lib._PROTOS declares {stale}, which kvclient.h does not"
    both = sorted(set(protos) & set(_lib.NOT_BOUND))
    assert not both, f"_lib: {both} both in _PROTOS and NOT_BOUND"
    for name, ((rb, rs), params) in funcs.items():
        if name in _lib.NOT_BOUND:
            continue
        assert name in protos, f"kvclient.h declares {name}: no prototype in _lib._PROTOS " \
                               "(nor in _lib.NOT_BOUND with a reason)"
        _, restype, argtypes, _ = protos[name]
        assert accepts(rb, rs, 0, restype), \
            f"{name}: returns {show(rb, rs)} in kvclient.h, restype {restype!r} in _lib.py"
        assert len(argtypes) == len(params), \
            f"{name}: {len(params)} parameters in kvclient.h, {len(argtypes)} argtypes in _lib.py"
        for i, ((pb, ps), ct) in enumerate(zip(params, argtypes)):
            assert accepts(pb, ps, 0, ct), \
                f"{name}: parameter {i + 1} is {show(pb, ps)} in kvclient.h, {ct!r} in _lib.py"


def test_fast_typedefs_match() -> None:
    _, funcs = header()
    src = strip_c(FAST.read_text())
    tds = {m[1]: (m[0], m[2]) for m in
           re.findall(r"typedef ([\w \*]+?)\s*\(\*(\w+)_fn\)\(([^)]*)\);", src, re.S)}
    assert set(tds) == {"req_new", "lookup", "req_free"}, \
        f"_kvcfast.c: typedefs {sorted(tds)}, expected req_new_fn, lookup_fn, req_free_fn"

    def plain(base: str, stars: int) -> Tuple[str, int]:
        return ("void", stars) if base in OPAQUE else (base, stars)

    for short, (ret, args) in tds.items():
        (rb, rs), params = funcs["kvc_" + short]
        fb, fs, _, _ = split_decl(ret + " x")
        assert (fb, fs) == plain(rb, rs), \
            f"_kvcfast.c {short}_fn returns {show(fb, fs)}, kvclient.h kvc_{short} {show(rb, rs)}"
        fparams = [split_decl(" ".join(a.split()))[:2] for a in args.split(",")]
        want = [plain(b, s) for b, s in params]
        assert fparams == want, (f"_kvcfast.c {short}_fn takes {fparams}, kvclient.h "
                                 f"kvc_{short} {want} (kvc_t and struct kvc_req as void)")
