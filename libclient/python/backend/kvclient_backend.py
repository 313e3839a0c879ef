# SPDX-License-Identifier: MIT
"""The build backend of `python3 -m pip install libclient/python` (PEP 517).

In the tree, standard library only, and it requires nothing: pip builds
the wheel with no download at all (no setuptools from an index), so the
install works offline and in any virtual environment.

The wheel holds the package (kvclient/*.py, py.typed), the library it
speaks to (kvclient/libkvclient.so.0, which kvclient/_lib.py loads before
looking anywhere else but $KVCLIENT_LIB) and kvclient-VERSION.dist-info,
so that importlib.metadata.version("kvclient") and `pip uninstall
kvclient` work. The library is taken from $KVCLIENT_LIB when set, else
from the build tree's build/libkvclient.so ($BUILD for another folder):
build it first (`make tools`). It needs only libc, so the copy is whole.

The version has one source: KVC_VERSION_MAJOR/MINOR/PATCH of
libclient/kvclient.h; kvclient.__version__ must say the same, and the
library copied must be that version (checked here, before anything is
written).

Also runnable: `python3 kvclient_backend.py --version` prints the version.
"""
from __future__ import annotations

import base64
import ctypes
import functools
import hashlib
import os
import re
import sys
import sysconfig
import zipfile
from pathlib import Path

PKG_ROOT = Path(__file__).resolve().parents[1]	# libclient/python
TREE = PKG_ROOT.parents[1]			# the repository
HEADER = PKG_ROOT.parent / "kvclient.h"
NAME = "kvclient"
SONAME = "libkvclient.so.0"
SUMMARY = "kvcached from Python: the KV-cache service's client, over libkvclient"


class BuildError(RuntimeError):
    """A wheel cannot be built; the message says why and what to do."""


def version() -> str:
    """X.Y.Z from kvclient.h's KVC_VERSION_MAJOR/MINOR/PATCH."""
    try:
        h = HEADER.read_text()
    except OSError as e:
        raise BuildError(f"{HEADER}: {e.strerror}: the version comes from it (build from "
                         "the kvcached tree)") from None
    parts = []
    for part in ("MAJOR", "MINOR", "PATCH"):
        m = re.search(r"^#define KVC_VERSION_%s (\d+)$" % part, h, re.M)
        if not m:
            raise BuildError(f"{HEADER}: no '#define KVC_VERSION_{part} N' line")
        parts.append(m.group(1))
    v = ".".join(parts)
    init = (PKG_ROOT / NAME / "__init__.py").read_text()
    m = re.search(r'^__version__ = "([^"]*)"$', init, re.M)
    if not m or m.group(1) != v:
        raise BuildError(f"{NAME}/__init__.py says __version__ "
                         f"{m.group(1) if m else '(none)'!r}, kvclient.h says {v}: make them "
                         "one")
    return v


def library(v: str) -> Path:
    """The libkvclient to put in the wheel: $KVCLIENT_LIB, else $BUILD's."""
    env = os.environ.get("KVCLIENT_LIB")
    path = Path(env) if env else TREE / os.environ.get("BUILD", "build") / "libkvclient.so"
    if not path.is_file():
        how = "$KVCLIENT_LIB" if env else "the build tree"
        raise BuildError(f"{path} ({how}): no such file. The wheel carries libkvclient: build "
                         "it first (make tools), or set KVCLIENT_LIB to a libkvclient.so of "
                         f"release {v}")
    try:
        got = ctypes.CDLL(str(path)).kvc_version_string
        got.restype = ctypes.c_char_p
        got = got().decode()
    except (OSError, AttributeError) as e:
        raise BuildError(f"{path}: not a loadable libkvclient: {e}") from None
    if got != v:
        raise BuildError(f"{path} is libkvclient {got}, this package is {v}: build the "
                         "library of this tree")
    return path


def _metadata(v: str) -> str:
    return (f"Metadata-Version: 2.1\nName: {NAME}\nVersion: {v}\nSummary: {SUMMARY}\n"
            "License: MIT\nRequires-Python: >=3.9\n"
            "Description-Content-Type: text/markdown\n\n"
            "The Python binding of kvcached's libkvclient (ctypes, standard library "
            "only;\nnumpy and torch are used when present). See docs/PYTHON.md of the "
            "kvcached tree.\n")


def _tag() -> str:
    plat = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return f"py3-none-{plat}"	# any Python 3 on this platform: the library is native


def _dist_info(v: str) -> str:
    return f"{NAME}-{v}.dist-info"


def _files(v: str) -> list[tuple[str, bytes]]:
    """(path in the wheel, contents) of everything but RECORD."""
    out = []
    src = PKG_ROOT / NAME
    for f in sorted(src.iterdir()):
        # _installed.py is make install's note; a wheel's library is its own.
        if f.is_file() and (f.suffix == ".py" or f.name == "py.typed") and \
           f.name != "_installed.py":
            out.append((f"{NAME}/{f.name}", f.read_bytes()))
    lib = library(v)
    out.append((f"{NAME}/{SONAME}", lib.read_bytes()))
    # The optional fast path (_kvcfast.c), built by make next to the library.
    # Its file name carries the interpreter's ABI tag, so another Python
    # never loads it and falls back to ctypes.
    for ext in sorted(lib.parent.glob("_kvcfast*.so")):
        out.append((f"{NAME}/{ext.name}", ext.read_bytes()))
    di = _dist_info(v)
    out.append((f"{di}/METADATA", _metadata(v).encode()))
    out.append((f"{di}/WHEEL", (f"Wheel-Version: 1.0\nGenerator: kvclient_backend {v}\n"
                                f"Root-Is-Purelib: false\nTag: {_tag()}\n").encode()))
    out.append((f"{di}/top_level.txt", f"{NAME}\n".encode()))
    return out


def _record_line(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}\n"


# ---- PEP 517 hooks -------------------------------------------------------

def _said(hook):
    """A BuildError ends the build with its message alone: SystemExit
    prints it and no traceback, so pip shows it as the build's whole
    output (issue #38: it was buried under one)."""
    @functools.wraps(hook)
    def run(*args, **kwargs):
        try:
            return hook(*args, **kwargs)
        except BuildError as e:
            raise SystemExit(f"kvclient: {e}") from None
    return run


def get_requires_for_build_wheel(config_settings=None):
    return []


@_said
def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    v = version()
    di = Path(metadata_directory) / _dist_info(v)
    di.mkdir(parents=True, exist_ok=True)
    (di / "METADATA").write_text(_metadata(v))
    return di.name


@_said
def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    v = version()
    files = _files(v)
    name = f"{NAME}-{v}-{_tag()}.whl"
    record = f"{_dist_info(v)}/RECORD"
    path = Path(wheel_directory) / name
    tmp = path.with_suffix(".tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        lines = []
        for arc, data in files:
            info = zipfile.ZipInfo(arc, date_time=(2020, 1, 1, 0, 0, 0))
            info.external_attr = (0o755 if arc.endswith((SONAME, ".so")) else 0o644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
            lines.append(_record_line(arc, data))
        lines.append(f"{record},,\n")
        z.writestr(zipfile.ZipInfo(record, date_time=(2020, 1, 1, 0, 0, 0)), "".join(lines))
    os.replace(tmp, path)
    return name


if __name__ == "__main__":
    if sys.argv[1:] == ["--version"]:
        print(version())
    else:
        sys.exit("usage: kvclient_backend.py --version   (pip uses it as a PEP 517 backend)")
