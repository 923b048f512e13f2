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

The choice is made in the process that does the work: a task's Python worker (whose
environment a standalone cluster or a Spark Connect server sets, not the daemon), and the
daemon (publish, compaction). An operator's ``ARROW_DEFAULT_MEMORY_POOL`` wins: pyarrow
reads it at import, and nothing here overrides it. Buffers allocated before the switch stay
with the pool that made them; the switch only changes where new ones come from.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)

PREFERRED = "jemalloc"
_chosen: str | None = None


def use_preferred() -> str:
    """Make jemalloc pyarrow's default pool in this process (once; cheap after the first
    call), unless the environment names a pool; the name of the pool in use."""
    global _chosen
    if _chosen is not None:
        return _chosen
    import pyarrow as pa

    if os.environ.get("ARROW_DEFAULT_MEMORY_POOL"):
        _chosen = pa.default_memory_pool().backend_name
        return _chosen
    try:
        pa.set_memory_pool(pa.jemalloc_memory_pool())
    except NotImplementedError:  # a pyarrow built without jemalloc: keep its default
        log.debug("pyarrow has no jemalloc; keeping %s", pa.default_memory_pool().backend_name)
    _chosen = pa.default_memory_pool().backend_name
    return _chosen
