"""A reset with a backfill lands while a main batch is in flight, on the lake's catalog
(issue 44): real Tansu broker, real Spark, moto's Glue and S3, the daemon in a thread with
``catalog: {type: glue}``. The fault point ``before-commit`` holds the main's batch after its
files are written and before its table commit; the reset (fence, roll forward, capture,
epoch) lands; the batch's commit must then fail on the fence (``PublishConflict``, counted),
and in the end every key is in the Glue table exactly once."""

from __future__ import annotations

import json
import threading
import uuid

import pytest

from reconciler import faults
from reconciler.control.apply import Applier
from reconciler.control.plan import Action, ActionKind
from reconciler.control.requests import from_cli
from reconciler.model import Position
from reconciler.store.store import Store
from tests.catalogs.test_glue_e2e import glue_counts, no_sql_table
from tests.e2e import helpers as h
from tests.e2e.test_reset_race import SID, BackgroundDaemon, Producer, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.spark]


class CommitGate:
    """Holds the main's next batch at ``before-commit`` (faults.install) until released."""

    def __init__(self):
        self.armed = False
        self.held = threading.Event()
        self.release = threading.Event()
        self.lock = threading.Lock()

    def arm(self) -> None:
        with self.lock:
            self.held.clear()
            self.release.clear()
            self.armed = True

    def __call__(self, name, subject):
        if name != "before-commit" or subject != SID:
            return None
        with self.lock:
            if not self.armed:
                return None
            self.armed = False
        self.held.set()
        if not self.release.wait(120):
            raise AssertionError("the test never released the batch it held")
        return None


def test_a_reset_fences_the_batch_in_flight_on_glue(spark, kafka_broker, topic, glue, tmp_path):
    name = topic(partitions=2)
    s = h.make_settings(tmp_path, segments=f"s3://{glue['bucket']}/warehouse", catalog=json.dumps(glue["setting"]))
    h.write_spec(s.specs, h.spec_doc(SID, h.kafka_source(kafka_broker.bootstrap, name, **{"fetch.queue.backoff.ms": 10}),
                                     task_duration="200ms", max_batch_records=4000))
    store = Store(s.db_url)
    store.migrate()
    gate = CommitGate()
    faults.install(gate)
    producer = Producer(kafka_broker.bootstrap, name)
    producer.start()
    hits = []
    try:
        with BackgroundDaemon(s) as bg:
            wait_for(lambda: sum(store.checkpoints(SID).values()) > 0, 120, "the first main batch")
            for i in range(3):
                gate.arm()
                wait_for(gate.held.is_set, 60, "a main batch written and about to commit")
                fut = bg.in_flight(SID)
                before = bg.conflicts(SID)
                req = from_cli(SID, Position("latest"), operation_id=uuid.uuid4().hex[:12], reason=f"glue race {i}")
                [res] = Applier(store, actor="cli:test", state_dir=s.state_path, warehouse=s.warehouse,
                                catalog=s.catalog).apply([Action(ActionKind.RESET_AND_BACKFILL, SID, req.describe(),
                                                                 request=req)])
                assert res.ok, res.message
                gate.release.set()
                wait_for(fut.done, 60, "the batch in flight to end")
                hits.append(bg.conflicts(SID) > before)
        keys = producer.stop()
    finally:
        faults.install(None)
        gate.release.set()
        if producer.is_alive():
            producer.stop()
    assert hits == [True, True, True]  # each held batch lost its commit on the fence
    code, _ = h.run_daemon(s, timeout=240)
    assert code == 0
    h.assert_exactly_once(glue_counts(glue, SID), keys)
    no_sql_table(s)
    actual = store.read_actual()
    bfs = [sid for sid, r in actual.supervisors.items() if r.parent_id == SID]
    assert bfs and all(str(actual.supervisors[b].state) == "COMPLETED" for b in bfs)
    store.close()
