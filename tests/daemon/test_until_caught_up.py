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
