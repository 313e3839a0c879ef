# SPDX-License-Identifier: MIT
"""tests/run-tests itself: how it counts what cmocka reports.

Every group of a binary counts (tests/gpu/pool runs two). A cmocka group
whose setup or teardown fails prints
``[  FAILED  ] GROUP SETUP`` / ``[  FAILED  ] GROUP TEARDOWN``; for a failed
teardown cmocka still exits 0, and run-tests once counted such a binary as
passed (issue #32: the GPU suite's cuda-pool daemon died on SIGTERM in its
group teardown, unseen). Each case here builds a real cmocka binary into
a scratch build folder and runs run-tests on it alone.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SRC = textwrap.dedent("""\
    #include <stdarg.h>
    #include <stddef.h>
    #include <setjmp.h>
    #include <stdint.h>
    #include <cmocka.h>
    static void passes(void **s) { (void)s; }
    static int setup(void **s) { (void)s; return SETUP_RC; }
    static int teardown(void **s) { (void)s; return TEARDOWN_RC; }
    int main(void)
    {
        const struct CMUnitTest t[] = { cmocka_unit_test(passes) };
        return cmocka_run_group_tests_name("fixture", t, setup, teardown) +
               (GROUPS ? cmocka_run_group_tests_name("second", t, NULL, NULL) : 0);
    }
    """)


def run_tests_on(tmp_path: Path, setup_rc: int, teardown_rc: int, groups: int = 1):
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("cc")
    if not cc:
        pytest.skip("no C compiler to build a cmocka fixture")
    bdir = tmp_path / "build" / "tests" / "unit"
    bdir.mkdir(parents=True)
    src = tmp_path / "fixture.c"
    src.write_text(SRC.replace("SETUP_RC", str(setup_rc)).replace("TEARDOWN_RC", str(teardown_rc))
                   .replace("GROUPS", str(groups - 1)))
    r = subprocess.run([cc, str(src), "-o", str(bdir / "fixture"), "-lcmocka"],
                       capture_output=True, text=True)
    if r.returncode:
        pytest.skip(f"cannot build a cmocka fixture: {r.stderr.strip()[:200]}")
    env = dict(os.environ, BUILD=str(tmp_path / "build"), KVT_DIRS="unit")
    env.pop("BUILDS", None)
    return subprocess.run([str(ROOT / "tests" / "run-tests")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def summary(r) -> str:
    return r.stdout.strip().splitlines()[-1]


def test_clean_group_passes(tmp_path):
    r = run_tests_on(tmp_path, 0, 0)
    assert r.returncode == 0, r.stdout
    assert summary(r) == "tests: 1 passed, 0 failed, 0 skipped"


def test_failed_group_teardown_is_a_failure(tmp_path):
    r = run_tests_on(tmp_path, 0, -1)
    assert "[  FAILED  ] GROUP TEARDOWN" in r.stdout
    assert r.returncode != 0, r.stdout
    assert "failed: unit/fixture" in r.stdout
    assert summary(r) == "tests: 1 passed, 1 failed, 0 skipped"


def test_failed_group_setup_is_a_failure(tmp_path):
    r = run_tests_on(tmp_path, -1, 0)
    assert "[  FAILED  ] GROUP SETUP" in r.stdout
    assert r.returncode != 0, r.stdout
    assert "failed: unit/fixture" in r.stdout


def test_every_group_counted(tmp_path):
    r = run_tests_on(tmp_path, 0, 0, groups=2)
    assert r.returncode == 0, r.stdout
    assert summary(r) == "tests: 2 passed, 0 failed, 0 skipped"
