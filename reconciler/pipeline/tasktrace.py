"""Worker-side timestamps of a batch's tasks, for ``benchmarks/freshness.py --trace``.

Off unless ``RECONCILER_TASK_TRACE`` names a file: each task then appends one JSON line
(its batch's data directory, when it started and ended in wall-clock seconds, the worker's
pid). Wall-clock, because the tasks run in Spark's Python workers, other processes than
the driver that compares them. A benchmark switch, not a product setting: nothing reads
the file but the benchmark.
"""

from __future__ import annotations

import json
import os

ENV = "RECONCILER_TASK_TRACE"


def enabled() -> bool:
    return bool(os.environ.get(ENV))


def note(data_dir: str, started: float, ended: float) -> None:
    path = os.environ.get(ENV)
    if not path:
        return
    line = json.dumps({"dir": data_dir, "start": started, "end": ended, "pid": os.getpid()}) + "\n"
    # O_APPEND: lines of concurrent workers do not interleave (each under PIPE_BUF)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
