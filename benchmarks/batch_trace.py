"""Where one small batch's time goes: timestamps along a batch, for ``freshness.py --trace``.

Driver side, the daemon runs in the benchmark's process, so its batch path is wrapped
in place (no product code knows of it): the step's start and end (``SupervisorRuntime.step``),
the offsets captured and the cut decided (``cut_ranges``, called once ``latest`` answered),
the Spark job submitted and returned (``tasks.run``), its files made durable
(``segments.finish``), the checks before the publish (``_same_spec``, ``_confirm_source``), the staging of the table commits
(``Tables.stage_append``) and the publish transaction (``Store.publish``). Worker side,
each task notes when it started and ended (``pipeline.tasktrace``, a file named by
``RECONCILER_TASK_TRACE``). The checkpoint's visibility comes from the benchmark's poller.
All in wall-clock seconds (the workers are other processes).

``gaps`` are the consecutive intervals of each batch; ``summary`` their median and p95.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import threading
import time
from pathlib import Path
from typing import Any

GAPS = [  # (name, from event, to event)
    ("capture", "step", "cut"),
    ("plan", "cut", "submit"),
    ("schedule", "submit", "task_start"),
    ("tasks", "task_start", "task_end"),
    ("collect", "task_end", "returned"),
    ("fsync", "returned", "finished"),
    ("job_to_checks", "finished", "job_done"),
    ("checks", "job_done", "confirmed"),
    ("to_staging", "confirmed", "stage_start"),
    ("staging", "stage_start", "stage_end"),
    ("transaction", "tx_start", "tx_end"),
    ("after_commit", "tx_end", "step_end"),
    ("commit_to_visible", "tx_end", "visible"),
    ("step_total", "step", "step_end"),
    ("idle_before_next", "step_end", "next_step"),
    ("cut_interval", "cut", "next_cut"),
]


class BatchTrace:
    def __init__(self, supervisor: str, work: Path):
        self.supervisor = supervisor
        self.task_file = work / "task-trace.jsonl"
        self.batches: list[dict[str, Any]] = []
        self._current = threading.local()
        self._undo: list[tuple[Any, str, Any]] = []

    def _ev(self, name: str, first: bool = False) -> None:
        b = getattr(self._current, "batch", None)
        if b is not None and not (first and name in b):
            b[name] = time.time()

    def _wrap(self, owner: Any, attr: str, before: str | None, after: str | None, hook=None) -> None:
        original = getattr(owner, attr)
        trace = self

        def wrapped(*args, **kwargs):
            if before:
                trace._ev(before, first=True)
            if hook:
                hook(*args, **kwargs)
            result = original(*args, **kwargs)
            if after:
                trace._ev(after)
            return result

        setattr(owner, attr, wrapped)
        self._undo.append((owner, attr, original))

    def attach(self) -> BatchTrace:
        from reconciler.pipeline import segments, tasks
        from reconciler.runtime import supervisor
        from reconciler.store.store import Store
        from reconciler.table.catalog import Tables

        os.environ["RECONCILER_TASK_TRACE"] = str(self.task_file)
        step = supervisor.SupervisorRuntime.step
        trace = self

        def traced_step(rt, *args, **kwargs):
            if rt.supervisor_id != trace.supervisor:
                return step(rt, *args, **kwargs)
            trace._current.batch = {"step": time.time()}
            try:
                return step(rt, *args, **kwargs)
            finally:
                b = trace._current.batch
                b["step_end"] = time.time()
                trace._current.batch = None
                if "returned" in b:
                    trace.batches.append(b)

        supervisor.SupervisorRuntime.step = traced_step
        self._undo.append((supervisor.SupervisorRuntime, "step", step))
        cut = supervisor.cut_ranges

        def traced_cut(*args, **kwargs):
            trace._ev("cut")
            ranges = cut(*args, **kwargs)
            b = getattr(trace._current, "batch", None)
            if b is not None:
                b["ends"] = {r.partition: r.end for r in ranges}
            return ranges

        supervisor.cut_ranges = traced_cut
        self._undo.append((supervisor, "cut_ranges", cut))

        def note_dir(spark, plan):
            b = getattr(trace._current, "batch", None)
            if b is not None:
                b["dir"] = plan.data_dir

        self._wrap(tasks, "run", "submit", "returned", hook=note_dir)
        self._wrap(segments, "finish", None, "finished")
        self._wrap(supervisor.SupervisorRuntime, "_same_spec", "job_done", None)
        self._wrap(supervisor.SupervisorRuntime, "_confirm_source", None, "confirmed")
        self._wrap(Tables, "stage_append", "stage_start", "stage_end")
        self._wrap(Store, "publish", "tx_start", "tx_end")
        return self

    def detach(self) -> None:
        for owner, attr, original in reversed(self._undo):
            setattr(owner, attr, original)
        os.environ.pop("RECONCILER_TASK_TRACE", None)

    def summary(self, visible_at, clock_offset: float) -> dict[str, Any]:
        """``visible_at(partition, offset)``: the poller's monotonic time a checkpoint passed
        ``offset``; ``clock_offset``: wall minus monotonic."""
        tasks: dict[str, list[dict]] = {}
        if self.task_file.exists():
            for line in self.task_file.read_text().splitlines():
                t = json.loads(line)
                tasks.setdefault(t["dir"], []).append(t)
        pids = set()
        batches = self.batches[1:]  # the first: the table's creation, a cold job
        for b, nxt in zip(batches, batches[1:] + [None], strict=True):
            ts = tasks.get(b.get("dir", ""), [])
            if ts:
                b["task_start"] = min(t["start"] for t in ts)
                b["task_end"] = max(t["end"] for t in ts)
                pids.update(t["pid"] for t in ts)
            seen = [visible_at(int(p), end - 1) for p, end in b.get("ends", {}).items()]
            if seen and all(s is not None for s in seen):
                b["visible"] = max(seen) + clock_offset
            if nxt is not None:
                b["next_step"], b["next_cut"] = nxt["step"], nxt.get("cut")
        out: dict[str, Any] = {"batches": len(batches), "worker_pids": len(pids)}
        for name, a, z in GAPS:
            xs = [(b[z] - b[a]) * 1000 for b in batches if b.get(a) is not None and b.get(z) is not None]
            if xs:
                xs.sort()
                out[name + "_ms"] = {"p50": round(statistics.median(xs), 1),
                                     "p95": round(xs[max(0, math.ceil(0.95 * len(xs)) - 1)], 1), "n": len(xs)}
        # Which phases make a slow step: each phase's median over the slowest 5% of steps.
        whole = [b for b in batches if b.get("step") is not None and b.get("step_end") is not None]
        whole.sort(key=lambda b: b["step_end"] - b["step"])
        slow = whole[-max(1, len(whole) // 20):] if whole else []
        out["slowest_5pct_ms"] = {name: round(statistics.median(xs), 1) for name, a, z in GAPS
                                  if (xs := [(b[z] - b[a]) * 1000 for b in slow
                                             if b.get(a) is not None and b.get(z) is not None])}
        return out
