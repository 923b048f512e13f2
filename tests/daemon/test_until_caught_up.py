"""``reconciler run --until-caught-up`` in scripts and cron (issue 14): it never waits forever
on a supervisor that cannot recover, and a stop before catching up is not success."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from reconciler import daemon as daemon_mod
from reconciler.daemon import tick as tick_mod
from tests.e2e import helpers as h

pytestmark = [pytest.mark.integration, pytest.mark.kafka]


def test_gives_up_with_exit_1_naming_a_supervisor_that_stays_unhealthy(tmp_path, kafka_broker, monkeypatch, caplog):
    monkeypatch.setattr(tick_mod, "UNHEALTHY_GRACE", 2.0)
    s = h.make_settings(tmp_path)
    h.write_spec(s.specs, h.spec_doc("ghost", h.kafka_source(kafka_broker.bootstrap, "no-such-topic-anywhere")))
    with caplog.at_level(logging.ERROR, logger="reconciler.daemon"):
        code, _ = h.run_daemon(s, until_caught_up=True, timeout=120)
    assert code == 1
    gave_up = [r.getMessage() for r in caplog.records if "giving up, not caught up" in r.getMessage()]
    assert gave_up and "ghost has been UNHEALTHY_SUPERVISOR" in gave_up[0] and "no-such-topic-anywhere" in gave_up[0]


def test_a_stop_before_catching_up_exits_1_and_says_what_is_left(tmp_path, kafka_broker, monkeypatch, caplog):
    s = h.make_settings(tmp_path)
    h.write_spec(s.specs, h.spec_doc("ghost", h.kafka_source(kafka_broker.bootstrap, "no-such-topic-either")))
    d = daemon_mod.Daemon(s)
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(d.run(until_caught_up=True, timeout=120)), daemon=True)
    with caplog.at_level(logging.ERROR, logger="reconciler.daemon"):
        thread.start()
        deadline = time.monotonic() + 60
        while not (d.lease_token is not None and d.passes > 0) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert d.passes > 0, "no reconcile pass within 60s"
        d.request_stop()
        thread.join(60)
    assert result == [1]
    assert any("before catching up" in r.getMessage() for r in caplog.records)


def test_the_loop_wakes_when_the_last_batch_published(tmp_path, kafka_broker, topic, spark, monkeypatch):
    """The loop sleeps a minute between its own checks here, so only the runtime's bell
    after the publish can end the run in time: it must not wait for the next check."""
    import devservices

    monkeypatch.setattr(tick_mod.Tick, "sleep_for", lambda self, *args: 60.0)
    name = topic(partitions=2)
    records = devservices.make_records(1500)
    devservices.produce_kafka(kafka_broker.bootstrap, name, records)
    s = h.make_settings(tmp_path, lease_ttl=600.0)  # the sleeping loop renews no lease meanwhile
    h.write_spec(s.specs, h.spec_doc("bell", h.kafka_source(kafka_broker.bootstrap, name)))
    d = daemon_mod.Daemon(s)
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(d.run(until_caught_up=True, timeout=300)), daemon=True)
    thread.start()
    thread.join(45)  # a sleeping loop would wake only after 60 s
    if thread.is_alive():
        d.request_stop()
        thread.join(60)
        pytest.fail("--until-caught-up did not wake after its last batch published")
    assert result == [0]
    h.assert_exactly_once(h.key_counts(spark, s, "bell"), h.keys(records))


def test_a_first_pass_fenced_by_the_lease_is_not_caught_up(tmp_path, kafka_broker, topic, spark, monkeypatch):
    """A slow start under load can lose the 3 s test lease before the first pass applies
    anything: that pass is fenced and creates no supervisor. --until-caught-up fixed its
    targets from that empty state and exited 0 at once, having read nothing; it must wait
    for a pass that concluded, then read every record."""
    import devservices
    from reconciler.daemon import leadership as leadership_mod

    real = leadership_mod.Leadership.leading_in_pass
    calls: list[int] = []

    def first_pass_fenced(self):  # the loader's progress call per spec, then the check before the plan
        calls.append(1)
        return False if len(calls) <= 2 else real(self)

    monkeypatch.setattr(leadership_mod.Leadership, "leading_in_pass", first_pass_fenced)
    name = topic(partitions=2)
    records = devservices.make_records(600)
    devservices.produce_kafka(kafka_broker.bootstrap, name, records)
    s = h.make_settings(tmp_path)
    h.write_spec(s.specs, h.spec_doc("late", h.kafka_source(kafka_broker.bootstrap, name)))
    code, _ = h.run_daemon(s, until_caught_up=True, timeout=120)
    assert code == 0 and len(calls) > 2
    h.assert_exactly_once(h.key_counts(spark, s, "late"), h.keys(records))
