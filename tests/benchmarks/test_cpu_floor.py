"""``benchmarks/cpu_floor.py`` on the session's Tansu broker: every stage (the raw consumer,
the product's reader, the transform, the Parquet sink, the task whole) sees each of the
records once, the written files hold every id exactly once, and every figure of the floor is
reported. No
speed threshold: the figures are read from the benchmark's JSON, not asserted here."""

from __future__ import annotations

import os
import time

import pytest

from tests.benchmarks.load import benchmark

RECORDS = 20_000


def test_broker_cpu_counts_a_process_tree():
    floor = benchmark("cpu_floor")
    before = floor.broker_cpu(os.getpid())
    deadline = time.process_time() + 0.3
    while time.process_time() < deadline:  # burn CPU in this process: the body is the work
        pass
    assert floor.broker_cpu(os.getpid()) - before >= 0.25
    assert floor.broker_cpu(None) == 0.0


@pytest.mark.integration
@pytest.mark.kafka
def test_every_stage_sees_each_record_once_and_the_floor_is_reported(kafka_broker, topic):
    floor = benchmark("cpu_floor")
    name = topic(partitions=floor.PARTITIONS)
    pid = kafka_broker.proc.pid if kafka_broker.proc else None
    doc = floor.measure(kafka_broker.bootstrap, pid, name, RECORDS, 0.8)
    assert doc["read"]["records"] == doc["transform"]["rows"] == RECORDS
    assert doc["write"]["rows"] == doc["write"]["distinct_ids"] == doc["write"]["ids"] == RECORDS
    for stage in ("raw", "read", "transform", "write"):
        assert doc[stage]["wall_s"] > 0 and doc[stage]["cpu_s"] >= 0, stage
    assert set(doc["cpu_s_per_1m"]) == {"raw_client", "reader", "transform", "write", "broker_raw",
                                        "broker_reader", "task", "broker_task"}
    for run in ("task_first", "task"):  # the product's task whole, each id once in what it wrote
        assert doc[run]["records"] == doc[run]["rows"] == doc[run]["distinct_ids"] == RECORDS, run
        assert doc[run]["files"] > 0 and doc[run]["cpu_s"] > 0, run
    per_1m = doc["cpu_s_per_1m"]
    assert doc["record_cpu_s_per_1m"] == pytest.approx(per_1m["task"] + per_1m["broker_task"], abs=0.005)
    assert doc["stages_cpu_s_per_1m"] == pytest.approx(
        per_1m["reader"] + per_1m["broker_reader"] + per_1m["transform"] + per_1m["write"], abs=0.005)
    assert doc["arrow_pool"] == (os.environ.get("ARROW_DEFAULT_MEMORY_POOL") or "jemalloc")
    assert doc["floor_seconds"] > 0 and doc["floor_seconds_raw_client"] > 0 and doc["goal_seconds"] > 0
    assert doc["goal_reachable"] == (doc["floor_seconds_raw_client"] <= doc["goal_seconds"])
