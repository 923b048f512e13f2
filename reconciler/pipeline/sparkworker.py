"""The Python worker daemon of local sessions: pyspark's own, with pyspark imported from its bytecode.

Spark starts its Python workers as ``python -m <daemon module> <worker module>`` with
``$SPARK_HOME/python/lib/pyspark.zip`` first on their path. Python never caches the
bytecode of modules imported from a zip, so every daemon and every worker it forks
compiles pyspark's sources again: 1.2-1.4 s of CPU per process (measured: importing
pyspark.worker takes 1.8 s from the zip, 0.57 s from the virtualenv). This module, as
``spark.python.daemon.module`` of local sessions (``sparkconf.LOCAL_CONF``), imports
pyspark from the virtualenv instead (the same version, checked) and imports
``pyspark.worker`` once before the daemon forks, so a new worker only imports pyarrow and
the stream client. It imports nothing of this package: it runs before every task.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path


def _spark_zips(path: list[str]) -> list[str]:
    return [p for p in path if re.search(r"(^|[/\\])(pyspark\.zip|py4j-[^/\\]*-src\.zip)$", p)]


def _same_pyspark(zip_path: str, rest: list[str]) -> bool:
    """Whether the pyspark importable from ``rest`` is the version inside ``zip_path``."""
    import importlib.machinery
    import zipfile

    spec = importlib.machinery.PathFinder.find_spec("pyspark", rest)
    if spec is None or not spec.submodule_search_locations:
        return False
    try:
        with zipfile.ZipFile(zip_path) as zf:
            zipped = zf.read("pyspark/version.py")
        installed = Path(next(iter(spec.submodule_search_locations)), "version.py").read_bytes()
    except (OSError, KeyError, zipfile.BadZipFile):
        return False
    return zipped == installed


def worker_daemon_path(path: list[str]) -> list[str]:
    """``path`` with Spark's pyspark.zip and py4j zip moved to the end when the same pyspark
    (and a py4j) is installed elsewhere on it; else ``path`` unchanged."""
    import importlib.machinery

    zips = _spark_zips(path)
    if not zips:
        return list(path)
    rest = [p for p in path if p not in zips]
    pyspark_zip = next((z for z in zips if z.endswith("pyspark.zip")), None)
    if pyspark_zip is not None and not _same_pyspark(pyspark_zip, rest):
        return list(path)
    if importlib.machinery.PathFinder.find_spec("py4j", rest) is None:
        return list(path)
    return rest + zips


def _run_worker_daemon() -> None:
    """``python -m reconciler.pipeline.sparkworker <worker module>``: pyspark's daemon, faster."""
    import runpy

    sys.path[:] = worker_daemon_path(sys.path)
    # Pure Python and thread-free (the daemon forks after this): each forked worker finds it
    # imported. Modules that start threads on import (pyarrow) stay after the fork.
    import pyspark.worker  # noqa: F401

    runpy.run_module("pyspark.daemon", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    _run_worker_daemon()
