"""One leader: a lease row with a fencing token; standbys wait, say so, and take over.

* two daemons on one database (SQLite and PostgreSQL, in process, no Spark): one leads,
  the other is standby in its STATUS line, ``/healthz`` body, heartbeat and
  ``reconciler status``; a clean stop releases the lease and the standby leads at once;
* two ``reconciler run`` processes on one PostgreSQL database: exactly one ingests;
  SIGKILL of the leader hands over to the standby within the lease time, and every
  key is committed exactly once across the handover;
* a deposed leader cannot publish: its lease is taken away while its batch runs (as
  after a pause longer than the lease), the batch's publish fails in the database,
  its files are discarded, and it steps down to standby.
"""

from __future__ import annotations

import re
import signal
import time
from datetime import UTC, datetime

import devservices
from reconciler.store.store import Store
from tests.daemon.test_notify import (
    NotifySocket,
    assert_consistent,
    checkpoints,
    daemon_env,
    daemons,  # noqa: F401 (fixture)
    supervisor,
    tail,
    wait_until,
)
from tests.daemon.test_watch import daemon_thread, suspended
from tests.e2e import helpers


def lease(settings) -> dict:
    """The lease row as a document (empty without one)."""
    store = Store(settings.db_url)
    try:
        row = store.lease()
        return row.to_dict() if row else {}
    finally:
        store.close()


def holder_of(log) -> str:
    m = re.search(r"daemon (\S+) starting", log.read_text())
    assert m, tail(log)
    return m.group(1)


def pg_settings(tmp_path, pg_cluster, name: str, **overrides):
    url = pg_cluster.create_database(f"{name}_{devservices.free_port()}")
    return helpers.make_settings(tmp_path, db=url, **overrides)


# --------------------------------------------------------------------------- in process, no Spark


def test_standby_says_so_and_takes_over_when_the_leader_stops(tmp_path, db_url):
    s = helpers.make_settings(tmp_path, db=db_url, lease_ttl=3.0, tick_interval=0.5)
    helpers.write_spec(s.specs, suspended("clicks"))
    with daemon_thread(s) as a:
        wait_until(lambda: a.lease_token is not None, 10, "a leader")
        b_ctx = daemon_thread(s)
        b = b_ctx.__enter__()
        try:
            wait_until(lambda: b.status_line().startswith("standby"), 10, "a standby")
            assert b.status_line() == f"standby: leader is {a.holder}"
            assert a.status_line().startswith("leader (token 1): 1 supervisor(s)")
            ok, body = b.metrics.health()
            assert ok and body["role"] == "standby"  # standing by is healthy
            assert b.metrics.registry.get_sample_value("reconciler_leader") == 0
            assert a.metrics.registry.get_sample_value("reconciler_leader") == 1
            wait_until(lambda: len(helpers.cli_json(s, "status", "--no-lag")["daemons"]) == 2, 10, "two heartbeats")
            doc = helpers.cli_json(s, "status", "--no-lag")
            assert (doc["leader"]["holder"], doc["leader"]["live"]) == (a.holder, True)
            assert [(d["daemon"], d["role"]) for d in doc["daemons"]] == [(a.holder, "leader"), (b.holder, "standby")]
            code, text = helpers.run_cli(s, "status", "--no-lag")
            assert code == 0
            assert f"leader: {a.holder} (token 1" in text and f"daemon: {b.holder} standby" in text
            # only the leader reconciles
            assert a.metrics.passes_count("changed") == 1 and b.metrics.passes_count("changed") == 0
        finally:
            a.request_stop()  # a clean stop releases the lease: no need to wait for it to expire
            t_stop = time.monotonic()
            wait_until(lambda: b.lease_token is not None, 10, "the standby to take over")
            took = time.monotonic() - t_stop
            assert b.lease_token == 2 and b.status_line().startswith("leader (token 2)")
            b_ctx.__exit__(None, None, None)
    assert took < 3.0  # well within the lease time: the lease was released, not left to expire


def test_deposed_leader_cannot_publish(tmp_path, pg_cluster, kafka_broker, topic, spark):
    name = topic(partitions=2)
    records = devservices.make_records(10_000)
    ends = devservices.produce_kafka(kafka_broker.bootstrap, name, records)
    s = pg_settings(tmp_path, pg_cluster, "deposed", lease_ttl=30.0)
    helpers.write_spec(s.specs, helpers.spec_doc("clicks", helpers.kafka_source(kafka_broker.bootstrap, name)))
    thief = Store(s.db_url)
    try:
        with daemon_thread(s) as a:
            # the first batch (all 10k records) is running when its state turns RUNNING
            def first_batch_running():
                rec = supervisor(s, "clicks")
                return rec is not None and rec.detailed_state == "RUNNING"

            wait_until(first_batch_running, 60, "the first batch to start", every=0.01)
            assert not helpers.batches(s, "clicks"), "the batch finished before the lease could be taken away"
            # a pause longer than the lease: another daemon took over meanwhile
            thief.release_lease(a.holder)
            assert thief.acquire_lease("thief", 60) == 2
            wait_until(lambda: a.metrics.registry.get_sample_value(
                "reconciler_publish_conflicts_total", {"supervisor": "clicks"}), 180, "the fenced publish")
            wait_until(lambda: a.lease_token is None, 10, "the deposed leader to step down")
            assert a.status_line() == "standby: leader is thief"
            assert helpers.batches(s, "clicks") == []  # nothing published
            assert checkpoints(s, "clicks") == {"0": 0, "1": 0}
            assert helpers.key_counts(spark, s, "clicks") == {}
            wait_until(lambda: not helpers.staging_leftovers(s), 10, "the fenced batch's files to be discarded")
            # the thief goes away: the standby leads again (token 3) and ingests everything once
            thief.release_lease("thief")
            wait_until(lambda: a.lease_token == 3, 10, "the takeover")
            wait_until(lambda: checkpoints(s, "clicks") == {str(p): e for p, e in ends.items()}, 240,
                       "ingestion under the new token")
    finally:
        thief.close()
    assert_consistent(spark, s, "clicks", "clicks", records, 2)


# --------------------------------------------------------------------------- two processes


def test_two_daemons_on_postgresql_kill_hands_over_exactly_once(tmp_path, pg_cluster, kafka_broker, topic,
                                                                 spark, daemons):  # noqa: F811
    # 40 batches: a small batch takes about 0.1 s, and A must still have some to go 0.5 s
    # after its first (5 batches of 800 were all done by then)
    n, ttl = 8_000, 4.0
    name = topic(partitions=2)
    records = devservices.make_records(n)
    ends = devservices.produce_kafka(kafka_broker.bootstrap, name, records)
    s = pg_settings(tmp_path, pg_cluster, "handover", lease_ttl=ttl, tick_interval=1.0)
    helpers.write_spec(s.specs, helpers.spec_doc("clicks", helpers.kafka_source(kafka_broker.bootstrap, name),
                                                 max_batch_records=200))
    with NotifySocket() as sd_a, NotifySocket() as sd_b:
        a, log_a = daemons.start("a", daemon_env(s, NOTIFY_SOCKET=sd_a.path))
        wait_until(lambda: "leader: lease taken (token 1)" in log_a.read_text(), 60, "A to lead", proc=a, log=log_a)
        holder_a = holder_of(log_a)
        b, log_b = daemons.start("b", daemon_env(s, NOTIFY_SOCKET=sd_b.path))
        sd_b.wait_for("READY", "1", proc=b, log=log_b)
        wait_until(lambda: f"standby: leader is {holder_a}" in sd_b.statuses(), 10, "B's standby STATUS",
                   proc=b, log=log_b)
        assert f"standby: {holder_a} holds the leader lease" in log_b.read_text()
        holder_b = holder_of(log_b)
        wait_until(lambda: len(helpers.cli_json(s, "status", "--no-lag")["daemons"]) == 2, 10, "two heartbeats")
        doc = helpers.cli_json(s, "status", "--no-lag")
        assert doc["leader"]["holder"] == holder_a
        assert [(d["daemon"], d["role"]) for d in doc["daemons"]] == [(holder_a, "leader"), (holder_b, "standby")]

        wait_until(lambda: helpers.batches(s, "clicks"), 180, "A's first batch", proc=a, log=log_a)
        assert "published" not in log_b.read_text()  # exactly one ingests
        time.sleep(0.5)  # into A's next batch
        by_a = len(helpers.batches(s, "clicks"))
        a.send_signal(signal.SIGKILL)
        t_kill = time.monotonic()
        a.wait(10)
        wait_until(lambda: lease(s).get("holder") == holder_b, ttl + 5, "B to take over", every=0.05,
                   proc=b, log=log_b)
        takeover = time.monotonic() - t_kill
        print(f"takeover {takeover:.2f}s after SIGKILL (leaseTtl {ttl}s)")
        # Within the lease time of A's last renewal (at most a second before the kill),
        # plus at most one standby poll (ttl/5).
        assert takeover <= ttl + ttl / 5 + 0.5
        assert lease(s)["token"] == 2
        wait_until(lambda: checkpoints(s, "clicks") == {str(p): e for p, e in ends.items()}, 300,
                   "B to ingest the rest", proc=b, log=log_b)
        wait_until(lambda: [d["daemon"] for d in helpers.cli_json(s, "status", "--no-lag")["daemons"]] == [holder_b],
                   ttl + 2, "A's heartbeat to expire")
        b.send_signal(signal.SIGTERM)
        assert b.wait(90) == 0, tail(log_b)
    text_b = log_b.read_text()
    assert 0 < by_a < len(helpers.batches(s, "clicks"))  # both ingested, one after the other
    taken = text_b.index("leader: lease taken (token 2)")
    assert "published" not in text_b[:taken] and "published" in text_b[taken:]
    assert f"{holder_a}'s lease having run out" in text_b[taken:].splitlines()[0]
    assert_consistent(spark, s, "clicks", "clicks", records, 2)
    assert lease(s)["expires_at"] <= datetime.now(UTC)  # released by B's clean stop: no wait for a successor
