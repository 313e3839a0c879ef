# SPDX-License-Identifier: MIT
"""One error table: libclient/client.c's errors[] against kvclient/errors.py.

- Every row of errors[] (the errors kvc_strerror names) has a class of its
  own in errors.py (error_class gives more than the KvcError base), and the
  class's docstring names the errno.
- Every errno errors.py maps is a row of errors[], or one the binding
  raises itself (errors._BINDING_ONLY).
- kvc_strerror(-errno) of the built library says each row's text
  (strerror's where the row has none).

A mismatch names the errno and the file that lacks it.
"""
from __future__ import annotations

import ctypes
import errno
import os
import re
from pathlib import Path
from typing import Dict, Optional

import pytest

from kvclient import errors

ROOT = Path(__file__).resolve().parents[2]
BUILD = (ROOT / os.environ.get("BUILD", "build")).resolve()
CLIENT_C = ROOT / "libclient" / "client.c"


def c_table() -> Dict[int, Optional[str]]:
    """errors[] of client.c: errno (positive) -> text (None: strerror's)."""
    src = CLIENT_C.read_text()
    m = re.search(r"^static const struct error_row \{.*?\} errors\[\] = \{\n(.*?)^\};", src,
                  re.M | re.S)
    assert m, "libclient/client.c: no `static const struct error_row ... errors[]` table"
    rows: Dict[int, Optional[str]] = {}
    for line in m.group(1).splitlines():
        r = re.match(r'\s*\{ (0|-E[A-Z0-9]+), (NULL|"(?:[^"\\]|\\.)*") \},', line)
        if not r:
            assert not line.strip().startswith("{"), f"client.c errors[]: unparsed row {line!r}"
            continue
        name, text = r.group(1), r.group(2)
        code = 0 if name == "0" else getattr(errno, name[1:], None)
        assert code is not None, f"client.c errors[]: {name} is no errno Python knows"
        assert code not in rows, f"client.c errors[]: {name} twice"
        rows[code] = None if text == "NULL" else bytes(text[1:-1], "utf-8").decode(
            "unicode_escape")
    assert len(rows) > 20, f"client.c errors[]: only {len(rows)} rows parsed"
    return rows


def test_every_c_error_has_a_class() -> None:
    for code in c_table():
        if code == 0:
            continue
        name = errno.errorcode[code]
        cls = errors.error_class(code)
        assert cls is not errors.KvcError, \
            f"{name} is in libclient/client.c's errors[] but kvclient/errors.py has no class for it"
        assert name in (cls.__doc__ or ""), \
            f"kvclient/errors.py: {cls.__name__} (for {name}) does not name {name} in its docstring"


def test_every_python_errno_is_a_c_error() -> None:
    table = c_table()
    for code, cls in errors._BY_ERRNO.items():
        name = errno.errorcode[code]
        if code in errors._BINDING_ONLY:
            assert code not in table, \
                f"kvclient/errors.py: {name} is _BINDING_ONLY but is in client.c's errors[]"
            continue
        assert code in table, (f"kvclient/errors.py maps {name} to {cls.__name__}, but "
                               "libclient/client.c's errors[] has no row for it")


def test_strerror_says_the_table() -> None:
    lib_path = BUILD / "libkvclient.so"
    if not lib_path.exists():
        pytest.skip(f"{lib_path} not built")
    lib = ctypes.CDLL(str(lib_path))
    lib.kvc_strerror.restype = ctypes.c_char_p
    lib.kvc_strerror.argtypes = [ctypes.c_int]
    for code, text in c_table().items():
        want = text if text is not None else os.strerror(code)
        got = lib.kvc_strerror(-code).decode()
        assert got == want, f"kvc_strerror(-{errno.errorcode.get(code, code)}): {got!r}, errors[]: {want!r}"
