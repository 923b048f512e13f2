"""The operator's webhook, end to end (issue 32): a daemon on a real broker tells a local HTTP
receiver of every audit event, in the audit log's order, through an outage of the receiver; an
endpoint that is down (refusing, or accepting and never answering) does not slow the reconcile
pass, and shows in ``status`` and ``/metrics``.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import urllib.request
from pathlib import Path

import pytest

import devservices
from reconciler import settings as settings_mod
from reconciler.daemon import Daemon
from reconciler.errors import RetryableError
from reconciler.store.store import Store
from tests.e2e import helpers as h
from tests.e2e.receiver import Receiver

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.spark]


def _settings(tmp_path, **values) -> settings_mod.Settings:
    base = h.make_settings(tmp_path)
    v = {"specs": base.specs, "state_dir": base.state_dir, "segments": str(base.segments_dir), "db": "",
         "spark_master": h.SPARK_MASTER, "http": "", "tick_interval": 0.5, "debounce": 0.1, "lease_ttl": 3.0,
         "compact_interval": 0, "maintain_interval": 0, **values}
    return settings_mod.load(v, config=os.devnull, env={})


def _wait(what, cond, timeout=120.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if cond():
                return
        except RetryableError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"no {what} within {timeout}s")


class _Daemon:
    def __init__(self, s):
        self.s, self.daemon = s, Daemon(s)
        self.thread = threading.Thread(target=lambda: self.daemon.run(timeout=600), daemon=True)

    def __enter__(self):
        self.thread.start()
        _wait("the database", lambda: (Path(self.s.state_dir) / "reconciler.db").exists(), 60)
        self.store = Store(self.s.db_url)
        return self

    def __exit__(self, *exc):
        self.daemon.request_stop()
        self.thread.join(120)
        self.store.close()


def test_a_receiver_gets_every_event_in_order(tmp_path, kafka_broker, topic, spark):
    receiver = Receiver()
    receiver.fail_next = 3  # the receiver starts with an outage: retried with backoff, in order
    s = _settings(tmp_path, webhook=receiver.url, lag_interval=0.5)
    name = topic(partitions=2)
    # small batches: the backfill takes 40 (a small batch takes ~0.1 s), so the observer,
    # looking every 0.5 s, sees it pass its milestones
    doc = h.spec_doc("hooked", h.kafka_source(kafka_broker.bootstrap, name), max_batch_records=100)
    first = devservices.make_records(1_000)
    devservices.produce_kafka(kafka_broker.bootstrap, name, first)
    try:
        with _Daemon(s) as d:
            store = d.store
            h.write_spec(s.specs, doc)
            _wait("the first batch", lambda: sum(store.checkpoints("hooked").values()) == 1_000)
            h.write_spec(s.specs, {**doc, "suspended": True})
            _wait("SUSPENDED", lambda: store.get("hooked").state == "SUSPENDED")
            second = devservices.make_records(4_000, start=1_000)
            devservices.produce_kafka(kafka_broker.bootstrap, name, second)
            (Path(s.specs) / "hooked.reset.yaml").write_text("resetTo: latest\nreason: INC-7 secret=hunter2\n")
            _wait("the reset", lambda: store.get("hooked-backfill-1") is not None)
            h.write_spec(s.specs, doc)
            _wait("the backfill completed", lambda: store.get("hooked-backfill-1").state == "COMPLETED")
            expected = [e for sid in ("hooked", "hooked-backfill-1") for e in store.history(sid)]
            receiver.wait_for(lambda ev: {e["id"] for e in ev} >= {e["id"] for e in expected})
    finally:
        receiver.close()

    events = receiver.events
    ids = [e["id"] for e in events]
    assert ids == sorted(ids) and len(ids) == len(set(ids)), "in the audit log's order, each once"
    assert receiver.requests >= len(events) + 3  # the outage's three refusals were retried
    by_id = {e["id"]: e for e in expected}
    assert [e["id"] for e in events if e["id"] in by_id] == sorted(by_id)  # nothing of them skipped
    types = [(e["type"], e["supervisor"]) for e in events]
    for wanted in [("supervisor.created", "hooked"), ("supervisor.suspended", "hooked"), ("reset.applied", "hooked"),
                   ("backfill.created", "hooked-backfill-1"), ("supervisor.resumed", "hooked"),
                   ("backfill.completed", "hooked-backfill-1")]:
        assert wanted in types, (wanted, types)
    assert types.index(("supervisor.created", "hooked")) < types.index(("reset.applied", "hooked")) \
        < types.index(("backfill.completed", "hooked-backfill-1"))
    progress = [e for e in events if e["type"] == "backfill.progress"]
    assert progress and all(e["details"]["percent"] in (25, 50, 75) for e in progress)
    for e in events:  # the shape every receiver can rely on
        assert {"type", "supervisor", "time", "id", "action", "actor", "details"} <= set(e)
        assert e["time"].endswith("+00:00")
    reset = next(e for e in events if e["type"] == "reset.applied")
    assert reset["details"]["backfill"] == "hooked-backfill-1" and reset["details"]["backfillRecords"] == 4_000
    assert "INC-7" in reset["reason"]
    assert receiver.paths[0] == "/hooks/s3cr3t-token"


def _blackhole() -> tuple[socket.socket, list[socket.socket]]:
    """A port that accepts connections and never answers (held open until closed)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    held: list[socket.socket] = []

    def accept():
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            held.append(conn)

    threading.Thread(target=accept, daemon=True).start()
    return srv, held


def test_an_endpoint_that_is_down_does_not_slow_the_tick(tmp_path, kafka_broker, topic, spark):
    """One endpoint accepts and never answers, one refuses: the reconcile passes stay short
    (none as long as one POST's timeout), the supervisor ingests its topic exactly once
    meanwhile with short publishes, and its lag in time is above 0 while it is behind."""
    hole, held = _blackhole()
    refused = f"http://127.0.0.1:{devservices.free_port()}/hook"
    port = devservices.free_port()
    s = _settings(tmp_path, webhook=f"http://127.0.0.1:{hole.getsockname()[1]}/hook,{refused}",
                  http=f"127.0.0.1:{port}")
    name, empty = topic(partitions=1), topic(partitions=1)
    first = devservices.make_records(1_000)
    devservices.produce_kafka(kafka_broker.bootstrap, name, first)
    doc = h.spec_doc("down-0", h.kafka_source(kafka_broker.bootstrap, name))
    try:
        with _Daemon(s) as d:
            store = d.store
            # the first event's POST is held open by the black hole; passes and batches go on meanwhile
            h.write_spec(s.specs, doc)
            _wait("a delivery stuck in the black hole", lambda: held, 60)
            _wait("down-0 ingesting while the webhook hangs", lambda: store.checkpoints("down-0") == {"0": 1_000})
            passes = d.daemon.metrics.passes_count("changed")
            for i in range(1, 4):
                h.write_spec(s.specs, h.spec_doc(f"down-{i}", h.kafka_source(kafka_broker.bootstrap, empty),
                                                 datasource=f"down-{i}"))
                _wait(f"down-{i} created while the webhook hangs", lambda i=i: store.get(f"down-{i}") is not None, 30)
            assert d.daemon.metrics.passes_count("changed") >= passes + 3
            # behind: suspended while records arrive, its lag in time shows
            h.write_spec(s.specs, {**doc, "suspended": True})
            _wait("down-0 SUSPENDED", lambda: store.get("down-0").state == "SUSPENDED", 60)
            second = devservices.make_records(1_000, start=1_000)
            devservices.produce_kafka(kafka_broker.bootstrap, name, second)
            time.sleep(1.5)  # the oldest unread record is older than a second
            code_behind, behind = h.run_cli(s, "status", "down-0", "-o", "json")
            h.write_spec(s.specs, doc)
            _wait("down-0 caught up", lambda: store.checkpoints("down-0") == {"0": 2_000})
            _wait("the refusing endpoint reported failing", lambda: any(
                w.failing_since for w in store.webhook_cursors() if w.label.startswith(refused.rsplit("/", 1)[0])), 30)
            code_after, after = h.run_cli(s, "status", "down-0", "-o", "json")
            code, out = h.run_cli(s, "status", "-o", "json", "--no-lag")
            metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
            code_text, text = h.run_cli(s, "status", "--no-lag")
            registry = d.daemon.metrics.registry
            ticks = registry.get_sample_value("reconciler_tick_duration_seconds_count")
            short_ticks = registry.get_sample_value("reconciler_tick_duration_seconds_bucket", {"le": "5.0"})
            publishes = registry.get_sample_value("reconciler_batch_phase_seconds_count",
                                                  {"supervisor": "down-0", "phase": "publish"})
            short_publishes = registry.get_sample_value("reconciler_batch_phase_seconds_bucket",
                                                        {"supervisor": "down-0", "phase": "publish", "le": "5.0"})
    finally:
        hole.close()
        for c in held:
            c.close()
    assert held, "the black hole never held a delivery"
    assert ticks and short_ticks == ticks, f"{ticks - short_ticks} of {ticks} passes took 5 s or more"
    assert publishes and short_publishes == publishes, f"{publishes - short_publishes} publishes took 5 s or more"
    h.assert_exactly_once(h.key_counts(spark, s, "down-0"), h.keys(first + second))
    assert code_behind == 0 and code_after == 0, (behind, after)
    was = json.loads(behind)["supervisors"][0]
    assert was["lag"] == 1_000 and was["lagSeconds"] is not None and was["lagSeconds"] > 0, was
    now = json.loads(after)["supervisors"][0]
    assert now["lag"] == 0 and now["lagSeconds"] == 0.0, now
    assert code == 0, out
    hooks = json.loads(out)["webhooks"]
    assert len(hooks) == 2 and any(w["failing"] and "refused" in (w["lastError"] or "").lower() for w in hooks), hooks
    assert all("/hook" not in w["endpoint"] for w in hooks)  # scheme, host and port only
    assert "FAILING since" in text
    failures = [line for line in metrics.splitlines() if line.startswith("reconciler_webhook_failures_total")]
    assert failures and any(float(line.split()[-1]) >= 1 for line in failures), failures
    assert any(line.startswith("reconciler_webhook_failing{") and line.endswith(" 1.0") for line in metrics.splitlines())
