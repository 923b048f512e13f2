"""Which allocator pyarrow uses in a process that runs batches: jemalloc, not mimalloc.

pyarrow's Linux wheels default to mimalloc, which backs its segments with transparent huge
pages and hands freed memory back to the kernel within milliseconds; what is allocated again
is faulted in again, 2 MiB zeroed at a time. Where a process holds many records at once
that is kernel time: each of ``benchmarks/cpu_floor.py``'s stages over 1M records cost 3.1-3.7
CPU-s in all with mimalloc against 2.4-2.6 with jemalloc (issue 45). A task that reads,
transforms and writes batch after batch reuses its memory sooner and pays little of it
(2.2-2.3 against 2.0-2.3), but its process stays smaller with jemalloc: a cold ``reconciler
run`` over 1M records peaked at 1,169-1,193 MiB against 1,286-1,310, and a worker's steady
heap over 250,000-record batches was 280 MiB against 372-380 (glibc's malloc: 317-330).

The pool is named in the environment before pyarrow is imported (``prefer_in_environment``,
from the ``reconciler`` entry point): Arrow C++ reads ``ARROW_DEFAULT_MEMORY_POOL`` once, and
Parquet's encoders take their buffers from that pool whatever pyarrow's Python-level default
says; Spark's local Python workers inherit the variable, and a cluster's executors get it
through ``spark.executorEnv`` (``pipeline.spark``). A process whose pyarrow was imported
first (a Spark Connect server's workers, an embedding application) switches pyarrow's own
default at the task's start (``use_preferred``), which its Parquet writes do not follow. An
operator's ``ARROW_DEFAULT_MEMORY_POOL`` wins everywhere. Buffers allocated before a switch
stay with the pool that made them.
"""

from __future__ import annotations

import logging
import os
import sys

log = logging.getLogger(__name__)

ENV = "ARROW_DEFAULT_MEMORY_POOL"
PREFERRED = "jemalloc"
_chosen: str | None = None


def preferred() -> str:
    """The pool this process's batches should use: the environment's, else jemalloc."""
    return os.environ.get(ENV) or PREFERRED


def prefer_in_environment() -> None:
    """Name jemalloc in the environment where no pool is named, for pyarrow's import in this
    process and its children. On Linux only, where pyarrow's wheels bundle jemalloc (a pool
    pyarrow lacks would be a warning at every start)."""
    if sys.platform.startswith("linux"):
        os.environ.setdefault(ENV, PREFERRED)


def use_preferred() -> str:
    """Make ``preferred()`` pyarrow's default pool in this process, once (cheap after the
    first call); the name of the pool in use. Before pyarrow's import this names it in the
    environment, which Arrow C++ follows too; after, it switches pyarrow's own default."""
    global _chosen
    if _chosen is not None:
        return _chosen
    if "pyarrow" not in sys.modules:
        prefer_in_environment()
    import pyarrow as pa

    wanted = preferred()
    if pa.default_memory_pool().backend_name != wanted:
        make = {"jemalloc": pa.jemalloc_memory_pool, "mimalloc": pa.mimalloc_memory_pool,
                "system": pa.system_memory_pool}.get(wanted)
        try:
            if make is not None:
                pa.set_memory_pool(make())
        except NotImplementedError:  # a pyarrow built without it: keep its default
            log.debug("pyarrow has no %s pool; keeping %s", wanted, pa.default_memory_pool().backend_name)
    _chosen = pa.default_memory_pool().backend_name
    return _chosen
