"""``freshness.py --trace``'s arithmetic (``benchmarks/batch_trace.py``) and the tasks' side
of it (``pipeline.tasktrace``), without a broker or Spark: the phases of each batch are the
gaps between its timestamps, the tasks' times joined by the batch's data directory, the
first batch (a cold job) left out."""

from __future__ import annotations

import json

from reconciler.pipeline import tasktrace
from tests.benchmarks.load import benchmark


def _batch(i: int) -> dict:
    t0, d = 100.0 + i, f"/w/b{i}"
    return {"step": t0, "cut": t0 + 0.010, "submit": t0 + 0.020, "returned": t0 + 0.200, "finished": t0 + 0.210,
            "job_done": t0 + 0.210, "confirmed": t0 + 0.215, "stage_start": t0 + 0.215, "stage_end": t0 + 0.255,
            "tx_start": t0 + 0.255, "tx_end": t0 + 0.260, "step_end": t0 + 0.261, "dir": d, "ends": {"0": 10 * (i + 1)}}


def test_the_phases_are_the_gaps_between_a_batch_s_timestamps(tmp_path, monkeypatch):
    trace = benchmark("batch_trace").BatchTrace("fresh", tmp_path)
    monkeypatch.setenv(tasktrace.ENV, str(trace.task_file))
    trace.batches = [_batch(i) for i in range(4)]
    for i in range(4):  # two tasks a batch: the first starts 50 ms after the submit, the last ends at 180
        tasktrace.note(f"/w/b{i}", 100.0 + i + 0.070, 100.0 + i + 0.150)
        tasktrace.note(f"/w/b{i}", 100.0 + i + 0.075, 100.0 + i + 0.180)
    lines = [json.loads(x) for x in trace.task_file.read_text().splitlines()]
    assert len(lines) == 8 and {x["dir"] for x in lines} == {f"/w/b{i}" for i in range(4)}

    def visible_at(partition: int, offset: int) -> float:  # batch i's last offset: 10 (i + 1) - 1
        return 100.0 + (offset + 1) // 10 - 1 + 0.263

    out = trace.summary(visible_at, clock_offset=0.0)

    assert out["batches"] == 3  # the first left out
    assert out["schedule_ms"]["p50"] == 50.0
    assert out["tasks_ms"]["p50"] == 110.0  # the first task's start to the last task's end
    assert out["collect_ms"]["p50"] == 20.0
    assert out["staging_ms"]["p50"] == 40.0
    assert out["transaction_ms"]["p50"] == 5.0
    assert out["cut_interval_ms"] == {"p50": 1000.0, "p95": 1000.0, "n": 2}  # the last has no next
    assert out["idle_before_next_ms"]["p50"] == 739.0
    assert out["commit_to_visible_ms"]["p50"] == 3.0


def test_tasks_note_nothing_unless_asked(tmp_path, monkeypatch):
    monkeypatch.delenv(tasktrace.ENV, raising=False)
    tasktrace.note("/w/b", 1.0, 2.0)
    assert not tasktrace.enabled() and list(tmp_path.iterdir()) == []
