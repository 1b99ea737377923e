"""Runs the plugin tests' helper scripts for `run_python` (conftest.py), each in a child forked from one process
that has already imported what every one of them imports first.

Every helper script here, and `python -m sglang.launch_server`, starts by importing torch, transformers and
SGLang: about 5 s of CPU before its own work, paid again by each of the 19 processes a run starts. This process
pays it once per test process, then serves requests read from stdin, one JSON line each ({"argv": [script,
*args] or ["-m", module, *args], "cwd": ..., "stdout": path, "stderr": path}): it forks, and the child runs the
script as `python script args...` (or `python -m module args...`) would (`__name__ == "__main__"`, sys.argv, the
script's folder, or the working directory, first on sys.path, stdout and stderr to the given files, stdin empty,
the exit status of SystemExit or 1 after an uncaught exception). It answers {"pid": ...} at the fork and
{"returncode": ...} when the child ends. The imports below start no thread (a fork copies one thread only), load
no plugin and apply no hook, and SGLang reads its settings from the environment when it runs, not when it is
imported. A script that needs other environment at import time (for example TRITON_INTERPRET) runs as a fresh
process instead."""

from __future__ import annotations

import atexit
import json
import os
import runpy
import sys
import threading
import traceback

import numpy  # noqa: F401  (the shared import cost: the reason this process exists)
import sglang  # noqa: F401
import sglang.srt.server_args  # noqa: F401
import torch  # noqa: F401
import transformers  # noqa: F401

from harness.lifetime import die_with_parent  # test/ is on PYTHONPATH (script_runs.python_env)


def _exit_status(exc: SystemExit) -> int:
    if exc.code is None or isinstance(exc.code, int):
        return exc.code or 0
    print(exc.code, file=sys.stderr)  # as the interpreter does for sys.exit("message")
    return 1


def _child(request: dict, runner: int) -> None:
    """Runs the script in this forked child and leaves the process with the script's exit status."""
    status = 1
    try:
        die_with_parent(expected_parent=runner)  # as the runner dies with its test process
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        for fd, key in ((1, "stdout"), (2, "stderr")):
            os.dup2(os.open(request[key], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
        os.chdir(request["cwd"])
        argv = list(request["argv"])
        try:
            if argv[0] == "-m":  # as `python -m module args...`: sys.argv[0] becomes the module's file
                sys.argv, sys.path[0] = argv[1:], os.getcwd()
                runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
            else:
                script = os.path.abspath(argv[0])
                sys.argv, sys.path[0] = argv, os.path.dirname(script)
                runpy.run_path(script, run_name="__main__")
            status = 0
        except SystemExit as exc:
            status = _exit_status(exc)
        except BaseException:
            traceback.print_exc()
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(status)


def main() -> None:
    assert threading.active_count() == 1, "forking needs a single-threaded parent"
    for line in sys.stdin:
        request = json.loads(line)
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            _child(request, os.getppid())
        print(json.dumps({"pid": pid}), flush=True)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}), flush=True)


if __name__ == "__main__":
    main()
