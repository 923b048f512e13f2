"""A daemon killed (SIGKILL) around the commit: nothing uncommitted is visible, and the
next run ingests the range exactly once and leaves no staging leftovers.

The crash run is a separate process (``reconciler run --until-caught-up`` with
``RECONCILER_CRASH_AT=<point>``: it SIGKILLs itself there, see ``reconciler.faults``);
the recovery run is the daemon in this process, without the variable.
"""

from __future__ import annotations

import zlib

import pytest

import devservices
from tests.e2e import helpers as h

pytestmark = [pytest.mark.integration, pytest.mark.spark]

N, MAX_BATCH = 6_000, 2_500


def _produce(system, request, records):
    """A fresh 2-partition source holding ``records``; returns (source doc, ends by partition)."""
    if system == "kafka":
        broker = request.getfixturevalue("kafka_broker")
        name = request.getfixturevalue("topic")(partitions=2)
        ends = devservices.produce_kafka(broker.bootstrap, name, records)
        return h.kafka_source(broker.bootstrap, name), {str(p): e for p, e in ends.items()}
    node = request.getfixturevalue("rabbit_node")
    make = request.getfixturevalue("stream")
    streams = [make(), make()]
    per = {st: [] for st in streams}
    for rec in records:
        per[streams[zlib.crc32(rec[0].encode()) % 2]].append(rec)
    for st, recs in per.items():
        devservices.produce_rabbit(node.stream_uri, st, recs)
    return h.rabbit_source(node.stream_uri, streams), {st: len(recs) for st, recs in per.items()}


@pytest.mark.parametrize(
    "point,after,system,db",
    [
        pytest.param("after-write", 0, "kafka", "sqlite", id="after-write-kafka-sqlite",
                     marks=pytest.mark.kafka),
        pytest.param("before-commit", 1, "kafka", "postgresql", id="before-commit-2nd-batch-kafka-postgresql",
                     marks=[pytest.mark.kafka, pytest.mark.postgres]),
        pytest.param("after-commit", 0, "rabbitmq", "sqlite", id="after-commit-rabbitmq-sqlite",
                     marks=pytest.mark.rabbitmq),
    ],
)
def test_killed_around_commit_then_exactly_once(spark, tmp_path, request, point, after, system, db):
    records = devservices.make_records(N)
    source, ends = _produce(system, request, records)
    s = h.make_settings(tmp_path, db=h.database(db, request))
    h.write_spec(s.specs, h.spec_doc("crashy", source, task_count=2, max_batch_records=MAX_BATCH))

    proc = h.run_subprocess(s, "run", "--until-caught-up", "--timeout", "180",
                            env={"RECONCILER_CRASH_AT": point, "RECONCILER_CRASH_AFTER": str(after)})
    assert proc.returncode == -9, f"exit {proc.returncode}\n{proc.stderr[-3000:]}"

    # After the kill: exactly what was committed is visible, once (the table commit is the publish).
    committed = h.batches(s, "crashy")
    visible = h.key_counts(spark, s, "crashy")
    assert all(n == 1 for n in visible.values())
    assert sum(visible.values()) == sum(b["rows"] for b in committed)
    assert h.segment_batch_ids(s, "crashy") == {b["batch_id"] for b in committed if b["rows"]}
    orphan_ids = {p.split("/")[1] for p in h.staging_leftovers(s)}
    if point == "after-commit":
        # table snapshot and checkpoints moved in one transaction: visible at once, nothing dangles
        assert len(committed) == 1 and orphan_ids == set()
    else:
        assert len(committed) == after
        assert len(orphan_ids) == 1, orphan_ids  # the killed batch's files, never referenced

    code, _ = h.run_daemon(s, timeout=180)
    assert code == 0

    h.assert_exactly_once(h.key_counts(spark, s, "crashy"), h.keys(records))
    assert h.staging_leftovers(s) == []
    final = h.batches(s, "crashy")
    assert all(b["status"] == "committed" for b in final)
    assert {b["batch_id"] for b in committed} <= {b["batch_id"] for b in final}
    assert h.segment_batch_ids(s, "crashy") == {b["batch_id"] for b in final if b["rows"]}
    h.assert_batches_tile(final, ends)  # every offset in exactly one committed batch
    [st] = h.cli_json(s, "status", "crashy")["supervisors"]
    assert st["records"] == N and st["lag"] == 0
