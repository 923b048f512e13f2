"""A process's long-lived heap, kept out of the garbage collector's full passes.

A full (generation 2) collection holds the interpreter while it walks every tracked
object. After its first batch a daemon holds about 210,000 of them (the functions, classes,
modules and caches of pyspark, py4j, pyiceberg, SQLAlchemy and ours), none of which will
ever be garbage. At ``taskDuration: 0.25s`` and 20,000 records/s a full pass came every
5 s and took 130-170 ms at the median, up to 250 ms: the batch it caught was late by that
much, every thread with it. ``gc.freeze()`` moves what exists to a permanent generation
that collections skip: once, after the first batch is published, when the batch path has
imported and built what it keeps. What is garbage then is collected first, not frozen.

A task's Python worker does the same after its first task (``pipeline.tasks``): it lives
across tasks with pyarrow, the stream client and the transform loaded, and a full pass
there delays the batch the same way.
"""

from __future__ import annotations

import gc
import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger(__name__)

_lock = threading.Lock()
_enabled = False  # a process that is the daemon (``reconciler run``) turns it on
_settled = False


def enable() -> None:
    """This process is the daemon: ``settle`` may freeze its heap. Not by default, so a
    process that only hosts a daemon for a while (a test session, a tool) keeps its own
    objects collectable."""
    global _enabled
    _enabled = True


def settle() -> bool:
    """Freeze the heap as it is now, once per process, when enabled; True the time it did."""
    global _settled
    with _lock:
        if _settled or not _enabled:
            return False
        _settled = True
    started = time.perf_counter()
    gc.collect()
    gc.freeze()
    log.debug("heap settled: %d objects frozen in %.0f ms", gc.get_freeze_count(),
              (time.perf_counter() - started) * 1000)
    return True


def settle_worker() -> bool:
    """``settle`` in a Spark Python worker that serves more tasks than this one (Spark's
    ``spark.python.worker.reuse``, on by default, sets ``SPARK_REUSE_WORKER``); a worker
    forked for one task only would pay the collection for nothing."""
    if os.environ.get("SPARK_REUSE_WORKER") != "1":
        return False
    enable()  # the worker is Spark's process, serving tasks only
    return settle()


_pause_lock = threading.Lock()
_pauses = 0  # pauses in progress in this process (tasks in threads: the tests, tools)
_resume = False  # whether the last pause to end turns collection back on


@contextmanager
def collections_paused() -> Iterator[None]:
    """No cyclic collection while a task reads, parses and writes its records.

    Every Kafka record arrives as a confluent-kafka ``Message``, an object the collector
    tracks, and a read holds up to ``CONSUME_CHUNK`` of them at once: each 700 allocations
    start a young collection that walks them, and the survivors are walked again in the
    older generations. None of them is ever part of a cycle (reference counting frees them
    when the read lets go), so the walks are pure cost: a fifth to a third of a task's CPU in
    a worker whose heap was not yet frozen, 8% in a settled one (sampled, issue 45). Bad
    records make no cycles either (every format's dead letters, reviewed); what cycles a task
    makes wait for the first collection after it.

    The state is the process's, so pauses in threads of one process count: the first to
    begin notes whether collection was on and turns it off, the last to end turns it back on
    if it was (a read of the state inside another pause would otherwise leave it off for
    good). An embedding application that turned collection off keeps it off.
    """
    global _pauses, _resume
    with _pause_lock:
        if _pauses == 0:
            _resume = gc.isenabled()
            gc.disable()
        _pauses += 1
    try:
        yield
    finally:
        with _pause_lock:
            _pauses -= 1
            if _pauses == 0 and _resume:
                gc.enable()
