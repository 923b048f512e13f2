"""Proof that this process and every Spark executor see one segments directory.

Without it, executors on another host write staged files to their own disk: the job
"succeeds", and the batch's files are nowhere this process can publish them from.
``spark.get_session`` runs it once per cluster session.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from reconciler.errors import SparkMisconfigured

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def check_shared_dir(session: SparkSession, path: str | os.PathLike[str], tasks: int | None = None) -> None:
    """Prove that this process and the executors see the same ``path``: this process writes a
    token there, each task reads it and writes one back, this process reads those."""
    root = Path(path).absolute() / "_staging" / f".shared-probe-{uuid.uuid4().hex[:12]}"
    root.mkdir(parents=True, exist_ok=True)
    token = uuid.uuid4().hex
    (root / "token").write_text(token, encoding="utf-8")
    n = tasks or max(2, _default_parallelism(session))
    try:
        rows = session.range(n, numPartitions=n).mapInArrow(
            _probe_task(str(root), token), "host string, seen boolean").collect()
        blind = sorted({r.host for r in rows if not r.seen})
        written = {p.name for p in root.iterdir() if p.name != "token"}
        lost = sorted({r.host for r in rows if r.seen} - {w.split("@", 1)[0] for w in written})
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if blind or lost:
        raise SparkMisconfigured(
            f"the segments directory {Path(path).absolute()} is not shared with the Spark executors "
            f"(executor host(s) {', '.join(blind + lost)} do not see what this process sees there): put it on "
            "a filesystem every executor and this process mount at the same path (NFS, a cluster "
            "filesystem), and set --segments to that path")


def _probe_task(root: str, token: str):
    def probe(batches):
        import os as _os
        import socket as _socket

        import pyarrow as _pa

        host = _socket.gethostname()
        try:
            with open(_os.path.join(root, "token"), encoding="utf-8") as f:
                seen = f.read() == token
        except OSError:
            seen = False
        if seen:
            with open(_os.path.join(root, f"{host}@{_os.getpid()}-{id(batches)}"), "w") as f:
                f.write(token)
        for _ in batches:
            pass
        yield _pa.RecordBatch.from_pydict({"host": [host], "seen": [seen]})

    return probe


def _default_parallelism(session: SparkSession) -> int:
    try:
        return int(session.sparkContext.defaultParallelism)
    except Exception:  # Spark Connect has no SparkContext
        return 2
