"""Proof that this process and every Spark executor see one segments directory.

Without it, executors on another host write staged files to their own disk: the job
"succeeds", and the batch's files are nowhere this process can publish them from.
``spark.get_session`` runs it once per cluster session.

On an object store (``s3://``) the same proof: this process PUTs a token under the
warehouse's ``_staging/`` prefix, each task GETs it through the store as the executors
reach it (their AWS environment, over the daemon's endpoint and region: ``sink.task_storage``)
and PUTs one back; a wrong endpoint or missing credentials on an executor is named here,
once, with the store's own words, before anything is ingested.
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
    from reconciler.table import storage

    if storage.is_object_store(path):
        _check_bucket(session, str(path), tasks)
        return
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


def _check_bucket(session: SparkSession, warehouse: str, tasks: int | None) -> None:
    from reconciler.spec.secrets import scrub
    from reconciler.table import storage

    files = storage.at(warehouse)
    root = files.join(warehouse, "_staging", f".shared-probe-{uuid.uuid4().hex[:12]}")
    token = uuid.uuid4().hex
    files.write_bytes(files.join(root, "token"), token.encode())
    n = tasks or max(2, _default_parallelism(session))
    try:
        rows = session.range(n, numPartitions=n).mapInArrow(
            _bucket_probe_task(root, token, storage.current().to_json()),
            "host string, seen boolean, error string").collect()
        written = {x.rsplit("/", 1)[-1] for x in files.list(root)} - {"token"}
    finally:
        files.delete_dir(root)
    blind = sorted({r.host for r in rows if not r.seen})
    lost = sorted({r.host for r in rows if r.seen} - {w.split("@", 1)[0] for w in written})
    if blind or lost:
        errors = sorted({r.error for r in rows if r.error})
        why = f": {scrub(errors[0])[:300]}" if errors else ""
        raise SparkMisconfigured(
            f"the warehouse {warehouse} is not reachable from the Spark executors as from this process "
            f"(executor host(s) {', '.join(blind + lost)}{why}): give the executors' hosts the AWS "
            "environment (AWS_ENDPOINT_URL when the store is not AWS, AWS_REGION, and credentials: "
            "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, a profile or an instance role) for the same store, "
            f"reached at {storage.current().public().executor_endpoint or storage.current().endpoint or 'AWS'} "
            "(objectStore.executorEndpoint when they reach it by another address)")


def _bucket_probe_task(root: str, token: str, store_json: str):
    def probe(batches):
        import os as _os
        import socket as _socket

        import pyarrow as _pa

        from reconciler.pipeline.sink import task_storage

        host = _socket.gethostname()
        error = None
        try:
            files = task_storage(root, store_json)
            seen = files.read_bytes(files.join(root, "token")).decode() == token
            if seen:
                files.write_bytes(files.join(root, f"{host}@{_os.getpid()}-{id(batches)}"), token.encode())
        except Exception as exc:  # noqa: BLE001 - the reason is the report
            seen, error = False, f"{type(exc).__name__}: {exc}"
        for _ in batches:
            pass
        yield _pa.RecordBatch.from_pydict({"host": [host], "seen": [seen], "error": [error]})

    return probe


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
