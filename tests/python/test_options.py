# SPDX-License-Identifier: MIT
"""The settings' documentation against options[] (daemon/config.c), in full.

`kvcached --print-options` dumps the table (key, default, what --help shows
where there is no default, type, value form, live). Against it:

- --help: one head `--key VALUE` per row, in the table's order, with
  `(default X)` where the row has one, and no other option.
- man/kvcached.8.in: one `.TP` entry per row under OPTIONS, with the
  row's value form and, where the row has a default (or a shown one), the
  text `default X` (or `X (the default)`); no entry for a key that is not
  a row.
- man/kvcached.conf.5.in: every key under KEYS once, no other.
- daemon/kvcached.conf.example: a `key = value` line (or `#key = value`)
  per row; a commented line shows the row's default, as the file says it
  does; a "Default: X" in a key's comment is the row's; no line for a key
  that is not a row.

Each mismatch is named (file, key, what it says, what options[] says).
"""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Dict, List, NamedTuple

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD = (ROOT / os.environ.get("BUILD", "build")).resolve()
KVCACHED = BUILD / "kvcached"
# Flags of the command line that are no setting (no row, no config key).
NOT_ROWS = {"config", "help", "version", "print-options"}


class Row(NamedTuple):
    key: str
    default: str
    shown: str
    type: str
    arg: str
    live: bool


def rows() -> Dict[str, Row]:
    if not KVCACHED.exists():
        pytest.skip(f"{KVCACHED} not built")
    out = subprocess.run([str(KVCACHED), "--print-options"], capture_output=True, text=True,
                         timeout=30, check=True).stdout
    table: Dict[str, Row] = {}
    for line in out.splitlines():
        f = line.split("\t")
        assert len(f) == 6, f"--print-options: not 6 fields: {line!r}"
        assert f[0] not in table, f"--print-options: {f[0]} twice"
        table[f[0]] = Row(f[0], f[1], f[2], f[3], f[4], f[5] == "live")
    assert len(table) > 30, f"--print-options printed {len(table)} rows"
    return table


def said_default(r: Row) -> str:
    """What the docs must give as the default: the row's, or --help's word."""
    return r.default or r.shown


def roff_text(s: str) -> str:
    """A roff line as the reader sees it: no font escapes, plain dashes."""
    s = re.sub(r"\\f[BIRP]", "", s)
    s = s.replace(r"\(dq", '"').replace(r"\-", "-").replace(r"\&", "").replace(r"\e", "\\")
    return s


def roff_args(line: str) -> List[str]:
    """The arguments of a macro line (.BI "a b" c), quotes honoured."""
    return [a[1:-1] if a.startswith('"') else a
            for a in re.findall(r'"[^"]*"|\S+', line.split(None, 1)[1] if " " in line else "")]


def says_default(text: str, value: str) -> bool:
    v = re.escape(value)
    return bool(re.search(r"(?i)\bdefault:?\s+" + v + r"(?!\w|\.\w)", text) or
                re.search(r"(?<![\w-])" + v + r" \(the default\)", text))


def man_sections(path: Path) -> Dict[str, List[str]]:
    sections: Dict[str, List[str]] = {}
    name = ""
    for line in path.read_text().splitlines():
        if line.startswith(".SH "):
            name = line[4:].strip().strip('"')
            sections[name] = []
        elif name:
            sections[name].append(line)
    return sections


def tp_entries(lines: List[str]) -> List[List[str]]:
    """Each `.TP` entry: its head line, then its paragraph's lines."""
    entries: List[List[str]] = []
    for line in lines:
        if line.startswith(".TP"):
            entries.append([])
        elif entries:
            entries[-1].append(line)
    return [e for e in entries if e]


def test_help_is_the_table() -> None:
    table = rows()
    out = subprocess.run([str(KVCACHED), "--help"], capture_output=True, text=True,
                         timeout=30).stdout
    keys = [k for k in re.findall(r"^  --([a-z][a-z0-9-]*)", out, re.M) if k not in NOT_ROWS]
    assert keys == list(table), (f"--help lists {sorted(set(keys) ^ set(table))} "
                                 "differently from options[] (or out of its order)")
    for r in table.values():
        head = f"  --{r.key}" + (f" {r.arg}" if r.arg else "")
        m = re.search("^" + re.escape(head) + r"(?:\s+(.*))?$", out, re.M)
        assert m, f"--help has no line {head!r} (options[]: --{r.key} takes {r.arg!r})"
        if said_default(r):
            assert (m.group(1) or "").startswith(f"(default {said_default(r)})"), \
                f"--help: --{r.key} does not say (default {said_default(r)}): {m.group(0)!r}"


def test_kvcached_8_options() -> None:
    table = rows()
    entries = tp_entries(man_sections(ROOT / "man" / "kvcached.8.in")["OPTIONS"])
    seen: Dict[str, List[str]] = {}
    for e in entries:
        args = [roff_text(a) for a in roff_args(e[0])]
        m = re.match(r"--([a-z][a-z0-9-]*)$", args[0] if args else "")
        if not m:
            continue
        key = m.group(1)
        if key in NOT_ROWS:
            continue
        assert key in table, f"man/kvcached.8.in: option --{key} is not in options[] (stale)"
        assert key not in seen, f"man/kvcached.8.in: --{key} listed twice"
        seen[key] = e
        arg = "".join(args[1:]).strip().strip('"')
        assert arg == table[key].arg, \
            f"man/kvcached.8.in: --{key} takes {arg!r}, options[]: {table[key].arg!r}"
        text = " ".join(re.sub(r"^\.[A-Z]+\s+", "", roff_text(x)).replace('"', "")
                        for x in e[1:])
        d = said_default(table[key])
        if d:
            assert says_default(text, d), \
                f"man/kvcached.8.in: --{key} does not say its default {d!r} (options[]): {text[:200]!r}"
    missing = [k for k in table if k not in seen]
    assert not missing, f"man/kvcached.8.in: OPTIONS lacks {missing} (in options[])"


def test_kvcached_conf_5_keys() -> None:
    table = rows()
    lines = man_sections(ROOT / "man" / "kvcached.conf.5.in")["KEYS"]
    seen: List[str] = []
    for e in tp_entries(lines):
        head = e[0]
        if not head.startswith((".B ", ".BR ")):
            continue
        for a in roff_args(head):
            a = roff_text(a).strip(", ")
            if a:
                seen.append(a)
    stale = [k for k in seen if k not in table]
    assert not stale, f"man/kvcached.conf.5.in: KEYS lists {stale}, not in options[] (stale)"
    twice = sorted({k for k in seen if seen.count(k) > 1})
    assert not twice, f"man/kvcached.conf.5.in: KEYS lists {twice} twice"
    missing = [k for k in table if k not in seen]
    assert not missing, f"man/kvcached.conf.5.in: KEYS lacks {missing} (in options[])"
    # The example's keys are settings too.
    ex = man_sections(ROOT / "man" / "kvcached.conf.5.in")["EXAMPLES"]
    for line in ex:
        m = re.match(r"^([a-z][a-z0-9\\-]*) = ", line)
        if m:
            assert roff_text(m.group(1)) in table, \
                f"man/kvcached.conf.5.in: EXAMPLES sets {roff_text(m.group(1))}, not in options[]"


def test_example_config() -> None:
    table = rows()
    path = ROOT / "daemon" / "kvcached.conf.example"
    comment: List[str] = []
    seen: Dict[str, str] = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        m = re.match(r"^(#?)([a-z][a-z0-9-]*) = ?(.*)$", line)
        if not m:
            comment = comment + [line] if line.startswith("#") else []
            continue
        hashed, key, value = m.group(1), m.group(2), m.group(3).strip()
        where = f"daemon/kvcached.conf.example:{n}"
        assert key in table, f"{where}: {key} is not in options[] (stale)"
        assert key not in seen, f"{where}: {key} again (first: line {seen[key]})"
        seen[key] = str(n)
        r = table[key]
        if hashed and r.default:
            assert value == r.default, \
                f"{where}: #{key} = {value} shows a default; options[]: {r.default}"
        text = " ".join(c.lstrip("# ") for c in comment)
        for said in re.findall(r"(?i)\bdefault:?\s+([^\s,;]+?)\.?(?=[\s,;]|$)", text):
            if said.lower() in ("the", "is", "none", "off") and not r.default:
                continue
            if r.default:
                assert said == r.default, \
                    f"{where}: {key}'s comment says default {said}; options[]: {r.default}"
        comment = []
    missing = [k for k in table if k not in seen]
    assert not missing, f"daemon/kvcached.conf.example has no line for {missing} (in options[])"
