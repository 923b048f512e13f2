"""Observability: ``/metrics`` (Prometheus) and ``/healthz`` of a running daemon.

* the health rules: 503 before the loop runs, with a failing supervisor on the leader,
  an unreachable database or an aborted reconcile; a standby that can reach the
  database is healthy;
* against a real broker: ``reconciler_partition_lag`` falls to 0 per partition while
  the daemon catches up (records ingested and unparseable counted, batch and tick
  durations, state, leader), then ``/healthz`` turns 503 when the broker is stopped and
  200 again when it is back.

The broker of the health test is a TansuBroker of its own (stopping the session's
would break other tests). Tansu keeps topics in memory, so the restarted broker (same
port) no longer has the topic: the test creates it again, empty. That is a topic deleted
and created again (issue 41.11: once silently read as caught up): the spec says
`onRetentionLoss: continue`, so the supervisor goes on from the new topic's earliest
offsets in a new source generation, recorded in its history, and is healthy again (by
default it would stay UNHEALTHY with the way out).
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

import devservices
from reconciler.observe.metrics import Metrics, serve
from tests.daemon.test_notify import wait_until
from tests.daemon.test_watch import daemon_thread
from tests.e2e import helpers


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def samples(port: int) -> dict[tuple[str, tuple], float]:
    """Every sample of ``/metrics`` as {(name, sorted labels): value}."""
    status, body = get(port, "/metrics")
    assert status == 200
    out = {}
    for family in text_string_to_metric_families(body):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def lag(m: dict, supervisor: str) -> dict[str, float]:
    return {dict(labels)["partition"]: v for (name, labels), v in m.items()
            if name == "reconciler_partition_lag" and dict(labels)["supervisor"] == supervisor}


def health(port: int) -> tuple[int, dict]:
    status, body = get(port, "/healthz")
    return status, json.loads(body)


# --------------------------------------------------------------------------- rules, no services


def test_health_rules_and_endpoints():
    m = Metrics()
    server = serve(m, "127.0.0.1:0")
    port = server.server_address[1]
    try:
        status, body = health(port)
        assert status == 503 and "not running" in body["problems"][0]  # the loop never ran
        m.loop_alive()
        m.set_role("leader")
        assert health(port)[0] == 200
        m.set_failing("clicks", "cannot reach 127.0.0.1:9092 within 10s")
        status, body = health(port)
        assert status == 503 and body["failing"] == {"clicks": "cannot reach 127.0.0.1:9092 within 10s"}
        m.prune_failing(["other"])  # clicks was terminated: its failure no longer counts
        assert health(port)[0] == 200
        m.reconcile_done("aborted", 0.1, error="database unavailable")
        assert health(port)[0] == 503
        m.reconcile_done("unchanged", 0.1)
        assert health(port)[0] == 200
        m.set_failing("clicks", "broker down")
        m.set_role("standby")  # a standby runs no supervisors: their failures are not its own
        status, body = health(port)
        assert status == 200 and body["role"] == "standby"
        m.database_error = "database unavailable or busy: connection refused"
        assert health(port)[0] == 503
        m.database_error = None
        m.last_loop -= m.max_loop_age + 1  # a hung loop
        status, body = health(port)
        assert status == 503 and "has not run for" in body["problems"][0]
        m.loop_alive()
        m.reconcile_done("changed", 0.02)
        m.reconcile_done("deferred", 0.001)
        m.observe_positions("clicks", {"0": 10, "1": 5}, {"0": 25, "1": 5})
        got = samples(port)
        assert got[("reconciler_partition_lag", (("partition", "0"), ("supervisor", "clicks")))] == 15
        assert got[("reconciler_partition_lag", (("partition", "1"), ("supervisor", "clicks")))] == 0
        assert got[("reconciler_reconcile_passes_total", (("outcome", "changed"),))] == 1
        assert got[("reconciler_tick_duration_seconds_count", ())] == 3  # deferred passes are not timed
        assert got[("reconciler_leader", ())] == 0
    finally:
        server.shutdown()
        server.server_close()


def test_state_gauges_follow_supervisors_and_forget_removed_ones():
    m = Metrics()
    m.set_states({"a": "RUNNING", "b": "IDLE"}, ["RUNNING", "IDLE"])
    m.set_states({"a": "IDLE"}, ["RUNNING", "IDLE"])
    get_ = m.registry.get_sample_value
    assert get_("reconciler_supervisor_state", {"supervisor": "a", "state": "IDLE"}) == 1
    assert get_("reconciler_supervisor_state", {"supervisor": "a", "state": "RUNNING"}) == 0
    assert get_("reconciler_supervisor_state", {"supervisor": "b", "state": "IDLE"}) is None


# --------------------------------------------------------------------------- a running daemon


def test_lag_falls_to_zero_and_healthz_follows_the_broker(tmp_path, spark):
    port = devservices.free_port()
    broker = devservices.TansuBroker(port=port).start()
    try:
        broker.create_topic("clicks", 2)
        records = devservices.make_records(6000)
        bad = [(f"bad{i}", b"{not json") for i in range(5)]
        ends = devservices.produce_kafka(broker.bootstrap, "clicks", records + bad)
        http = devservices.free_port()
        s = helpers.make_settings(tmp_path, http=f"127.0.0.1:{http}", tick_interval=0.5)
        helpers.write_spec(s.specs, helpers.spec_doc("clicks", helpers.kafka_source(broker.bootstrap, "clicks"),
                                                     max_batch_records=200, onRetentionLoss="continue"))
        with daemon_thread(s):
            seen: list[float] = []

            def caught_up() -> bool:
                parts = lag(samples(http), "clicks")
                if len(parts) == 2:
                    seen.append(sum(parts.values()))
                return len(parts) == 2 and sum(parts.values()) == 0

            wait_until(caught_up, 180, "lag 0 on every partition", every=0.1)
            assert seen[0] > 0 and max(seen) >= 1500, seen  # it started behind...
            assert seen == sorted(seen, reverse=True), seen  # ...and only fell
            # through intermediate values, batch by batch (31 batches: a small one takes ~0.1 s,
            # and five of 1,500 were all done before the first look)
            assert len(set(seen)) >= 3, seen
            wait_until(lambda: health(http)[0] == 200, 30, "healthy")
            wait_until(lambda: samples(http).get(("reconciler_supervisor_state",
                                                  (("state", "IDLE"), ("supervisor", "clicks")))) == 1,
                       10, "state IDLE in the gauges")
            m = samples(http)
            by = (("supervisor", "clicks"),)
            assert m[("reconciler_records_ingested_total", by)] == 6005
            assert m[("reconciler_records_unparseable_total", by)] == 5
            batches = m[("reconciler_batch_duration_seconds_count", by)]
            assert batches >= 4
            for phase in ("capture", "plan", "job", "publish"):  # every batch observed each phase
                key = (("phase", phase), ("supervisor", "clicks"))
                assert m[("reconciler_batch_phase_seconds_count", key)] == batches, phase
                assert m[("reconciler_batch_phase_seconds_sum", key)] > 0, phase
            assert m[("reconciler_tick_duration_seconds_count", ())] >= 1
            assert m[("reconciler_reconcile_passes_total", (("outcome", "changed"),))] == 1
            assert m[("reconciler_leader", ())] == 1
            assert m[("reconciler_partition_checkpoint", (("partition", "0"), ("supervisor", "clicks")))] == ends[0]
            status, body = health(http)
            assert body["role"] == "leader" and body["failing"] == {}

            broker.stop()
            t_stop = time.monotonic()
            status, body = wait_until(lambda: (lambda h: h if h[0] == 503 else None)(health(http)), 60,
                                      "503 with the broker stopped", every=0.2)
            print(f"503 {time.monotonic() - t_stop:.1f}s after the broker stopped: {body['problems']}")
            assert "clicks" in body["failing"]

            broker = devservices.TansuBroker(port=port).start()
            broker.create_topic("clicks", 2)  # in-memory storage: the topic is gone, see the docstring
            t_back = time.monotonic()
            wait_until(lambda: health(http)[0] == 200, 120, "200 with the broker back", every=0.2)
            print(f"200 {time.monotonic() - t_back:.1f}s after the broker came back")
            assert health(http)[1]["failing"] == {}
            assert "source-restarted" in [e["action"] for e in helpers.cli_json(s, "history", "clicks")]
    finally:
        broker.stop()
    helpers.assert_exactly_once(helpers.key_counts(spark, s, "clicks"), helpers.keys(records))
    assert helpers.staging_leftovers(s) == []
