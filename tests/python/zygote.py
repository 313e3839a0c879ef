# SPDX-License-Identifier: MIT
"""A parent for the engine processes of the Python suites: it imports torch
once (1.8 s of a 2-CPU machine's time per process) and forks each engine
process from itself, so that fifty engine processes do not import it fifty
times. Each engine is still a process of its own: its own address space,
its own connection to the daemon, its own exit.

Started by conftest.Zygote with the engines' environment. Reads one JSON
request a line on stdin, {"argv": [script, args...], "out": path, "err":
path, "timeout": seconds}; forks a child that runs the script as
`python script args...` would (stdin /dev/null, stdout and stderr into the
two files, `__main__`, exit status from SystemExit or 1 on an uncaught
exception); writes {"rc": status} a line (-N for a signal, as subprocess
says). A child past its timeout is killed with its process group and
answers {"rc": -9, "timeout": true}. Nothing but torch's import happens
here before the fork: no torch op (its thread pools would not survive a
fork), no kvclient (a child opens its own)."""
from __future__ import annotations

import atexit
import json
import os
import runpy
import signal
import sys
import threading
import time
import traceback

import torch  # noqa: F401  (the point of this process)


def run_child(req: dict) -> None:
    argv = req["argv"]
    os.setpgid(0, 0)
    fd = os.open(os.devnull, os.O_RDONLY)
    os.dup2(fd, 0)
    for target, path in ((1, req["out"]), (2, req["err"])):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(fd, target)
        os.close(fd)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.argv = list(argv)
    sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
    code = 0
    try:
        runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as e:
        if e.code is None:
            code = 0
        elif isinstance(e.code, int):
            code = e.code
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    # What the interpreter does at its end: wait for threads, exit hooks.
    try:
        threading._shutdown()  # type: ignore[attr-defined]
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        traceback.print_exc()
        code = code or 1
    os._exit(code & 0xff)


def wait(pid: int, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        got, status = os.waitpid(pid, os.WNOHANG)
        if got == pid:
            return {"rc": os.waitstatus_to_exitcode(status)}
        if time.monotonic() > deadline:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            os.waitpid(pid, 0)
            return {"rc": -signal.SIGKILL, "timeout": True}
        time.sleep(0.005)


def main() -> None:
    reply = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # nothing of ours or a child's on the reply channel
    reply.write('{"ready": true}\n')
    reply.flush()
    for line in sys.stdin:
        req = json.loads(line)
        pid = os.fork()
        if pid == 0:
            reply.close()
            run_child(req)
        reply.write(json.dumps(wait(pid, float(req.get("timeout", 180)))) + "\n")
        reply.flush()


if __name__ == "__main__":
    main()
