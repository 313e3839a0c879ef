# SPDX-License-Identifier: MIT
"""The documentation against the tree it documents.

- Every C and Python example in README.md and docs/*.md is a file of the
  tree, quoted verbatim: the fenced block follows a line
  `<!-- quote: PATH -->` (the whole file, less an SPDX line at its top) or
  `<!-- quote: PATH NAME -->` (the lines between `quote: NAME` and
  `end quote` comment lines in the file, less their common indentation).
  A block of another language may be quoted the same way and is then
  checked too. (tests/integration/examples builds and runs the programs.)
- One version: kvclient.h's KVC_VERSION_MAJOR/MINOR/PATCH is what every
  program's --version says, what the library returns, what the manual
  pages and kvclient.pc are stamped with, and every version the docs
  write next to kvcached or libkvclient (recorded benchmark runs keep the
  version they ran).
- The shared-memory layout version the docs show is KVSHM_VERSION.
- The manual pages `make` builds lint clean: groff -ww finds nothing, and
  man --warnings renders them without a word.
- docs/INSTALL.md's package list is what `make deps-run` installs.
"""
from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / os.environ.get("BUILD", "build")
DOCS = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
MAN_PAGES = ["kvcached.8", "kvcached.conf.5", "kvstat.1", "kvdemo.1", "kvbench.1",
             "libkvclient.3"]
PROGRAMS = ["kvcached", "kvstat", "kvdemo", "kvbench", "kvbench-gpu"]
FENCE = re.compile(r"^```(\w*)\s*$")
MARK = re.compile(r"^<!-- quote: (\S+)(?: (\S+))? -->$")


def version() -> tuple[str, int]:
    h = (ROOT / "libclient" / "kvclient.h").read_text()
    part = [int(re.search(r"^#define KVC_VERSION_%s (\d+)$" % p, h, re.M).group(1))
            for p in ("MAJOR", "MINOR", "PATCH")]
    return "%d.%d.%d" % tuple(part), part[0] * 1000000 + part[1] * 1000 + part[2]


def blocks(md: Path):
    """(language, first line number, text, the mark before it or None)."""
    lines = md.read_text().split("\n")
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start = i
        i += 1
        while i < len(lines) and lines[i] != "```":
            i += 1
        text = "\n".join(lines[start + 1:i]) + "\n"
        j = start - 1
        while j >= 0 and not lines[j].strip():
            j -= 1
        mark = MARK.match(lines[j]) if j >= 0 else None
        yield m.group(1), start + 1, text, mark
        i += 1


def dedent(lines: list[str]) -> list[str]:
    used = [l for l in lines if l.strip()]
    n = min((len(l) - len(l.lstrip("\t ")) for l in used), default=0)
    return [l[n:] for l in lines]


def quoted(path: str, name: str | None) -> str:
    src = (ROOT / path).read_text()
    lines = src.split("\n")
    if name is None:
        if lines and "SPDX-License-Identifier" in lines[0]:
            lines = lines[1:]
        return "\n".join(lines)
    begin = [k for k, l in enumerate(lines)
             if re.fullmatch(r"\s*(/\*|#|<!--) quote: %s( \*/| -->)?" % re.escape(name), l)]
    assert len(begin) == 1, "%s: %d regions named %s" % (path, len(begin), name)
    end = next(k for k in range(begin[0] + 1, len(lines))
               if re.fullmatch(r"\s*(/\*|#|<!--) end quote( \*/| -->)?", lines[k]))
    return "\n".join(dedent(lines[begin[0] + 1:end])) + "\n"


def test_examples_are_quoted_files():
    seen = 0
    for md in DOCS:
        for lang, line, text, mark in blocks(md):
            where = "%s:%d" % (md.relative_to(ROOT), line)
            if lang in ("c", "python") and not mark:
                pytest.fail("%s: a %s example that is not a file of the tree: put it in "
                            "tools/examples/ and quote it (<!-- quote: PATH [NAME] -->)"
                            % (where, lang))
            if not mark:
                continue
            assert (ROOT / mark.group(1)).is_file(), "%s: no file %s" % (where, mark.group(1))
            want = quoted(mark.group(1), mark.group(2))
            assert text == want, "%s: the block differs from %s%s" % (
                where, mark.group(1), " region " + mark.group(2) if mark.group(2) else "")
            seen += 1
    assert seen >= 4  # the README's engine (2), INSTALL.md's hello-kvc, TINYLM.md's schema


def test_every_example_file_is_quoted():
    """No example in tools/examples/ that the docs forgot."""
    marks = set()
    for md in DOCS:
        for _, _, _, mark in blocks(md):
            if mark:
                marks.add(mark.group(1))
    for f in sorted((ROOT / "tools" / "examples").iterdir()):
        if f.is_file() and f.suffix in (".c", ".py", ".xml"):
            assert str(f.relative_to(ROOT)) in marks, "%s is quoted by no doc" % f.name


def test_programs_say_the_version():
    v, _ = version()
    for p in PROGRAMS:
        out = subprocess.run([str(BUILD / p), "--version"], capture_output=True, text=True,
                             timeout=20)
        assert out.returncode == 0, "%s --version: %s" % (p, out.stderr)
        assert re.match(r"^%s %s( |\n)" % (re.escape(p), re.escape(v)), out.stdout), \
            "%s --version: %r" % (p, out.stdout)


def test_library_says_the_version():
    v, n = version()
    lib = ctypes.CDLL(str(BUILD / "libkvclient.so"))
    lib.kvc_version_string.restype = ctypes.c_char_p
    assert lib.kvc_version() == n
    assert lib.kvc_version_string().decode() == v


def without_recorded_runs(md: Path) -> str:
    """The text of a doc, less docs/BENCHMARKS.md's fenced blocks: those are
    runs as they were recorded, with the version they ran."""
    text = md.read_text()
    if md.name != "BENCHMARKS.md":
        return text
    return re.sub(r"^```.*?^```$", "", text, flags=re.M | re.S)


def test_docs_say_the_version():
    v, n = version()
    found = 0
    for md in DOCS + sorted((ROOT / "man").glob("*.in")):
        text = without_recorded_runs(md)
        for m in re.finditer(r"libkvclient\.so\.(\d+\.\d+\.\d+)", text):
            assert m.group(1) == v, "%s: libkvclient.so.%s" % (md.name, m.group(1))
            found += 1
        for m in re.finditer(r"\b(?:libkvclient|kvcached|kvstat|kvdemo|kvbench) "
                             r"(\d+\.\d+\.\d+)(?: \((\d+)\))?", text):
            assert m.group(1) == v, "%s: %s" % (md.name, m.group(0))
            assert m.group(2) is None or int(m.group(2)) == n, "%s: %s" % (md.name, m.group(0))
            found += 1
    assert found >= 2


def test_docs_say_the_layout_version():
    """The shared-memory layout's version, where the docs show one."""
    want = int(re.search(r"^#define KVSHM_VERSION (\d+)u", (ROOT / "shm" / "segment.h").read_text(),
                         re.M).group(1))
    found = 0
    for md in DOCS:
        text = without_recorded_runs(md)
        for m in re.finditer(r"segment v(\d+)|\"shm_version\":(\d+)|shm layout (\d+)", text):
            got = int(next(g for g in m.groups() if g))
            assert got == want, "%s: %s (the layout is %d)" % (md.name, m.group(0), want)
            found += 1
    assert found >= 2


def test_pc_and_man_pages_are_stamped():
    assert "Version: @VERSION@" in (ROOT / "libclient" / "kvclient.pc.in").read_text()
    v, _ = version()
    for page in MAN_PAGES:
        th = next(l for l in (BUILD / "man" / page).read_text().split("\n")
                  if l.startswith(".TH "))
        assert '"kvcached %s"' % v in th, "%s: %s" % (page, th)


@pytest.mark.parametrize("page", MAN_PAGES)
def test_man_page_lints_clean(page):
    path = BUILD / "man" / page
    assert path.is_file(), "%s not built (make)" % path
    if not shutil.which("groff"):
        pytest.skip("groff not installed (Debian: groff-base)")
    out = subprocess.run(["groff", "-ww", "-z", "-man", str(path)], capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0 and not out.stderr, "groff -ww: %s" % out.stderr
    if not shutil.which("man"):
        pytest.skip("man not installed (Debian: man-db)")
    env = dict(os.environ, MANWIDTH="80", LC_ALL="C.UTF-8", MAN_KEEP_FORMATTING="0")
    out = subprocess.run(["man", "--warnings", "-l", str(path)], capture_output=True,
                         text=True, env=env, timeout=30)
    assert out.returncode == 0 and not out.stderr, "man --warnings: %s" % out.stderr
    assert len(out.stdout) > 200


def test_install_lists_the_run_packages():
    """docs/INSTALL.md's package list is tools/install-deps' RUN_PKGS, the
    packages `make deps-run` installs and all `make install` needs
    (tests/integration/install builds it with the test-only ones hidden)."""
    deps = (ROOT / "tools" / "install-deps").read_text()
    run = []
    for m in re.finditer(r'^RUN_PKGS="(?:\$RUN_PKGS )?([^"]*)"$', deps, re.M):
        run += m[1].split()
    assert len(run) >= 8, run
    md = (ROOT / "docs" / "INSTALL.md").read_text()
    m = re.search(r"<!-- run-packages: tools/install-deps RUN_PKGS -->\n`([^`]*)`", md)
    assert m, "docs/INSTALL.md lost its run-packages line"
    assert m[1].split() == run
    assert "make deps-run" in md and "make install" in md
