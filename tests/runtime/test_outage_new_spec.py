"""Review of 30cf60c (a failure said once per outage): an operator's answer to a failure (a
new spec, which the manager hands the runtime as ``reconsider()``: "forget past failures")
does not start a new outage in the log. When the new spec fails too, with a message that
differs from the old one only in its digits (another broker address: 10.0.0.5:9092 ->
10.0.0.6:9093, kafka-1 -> kafka-2), ``Outage`` compares the messages with the digits masked,
calls it the same problem, and writes the new spec's first failure at DEBUG: at the default
level the operator's fix attempt is followed by silence, as if it had worked.

Real Kafka client against loopback ports nobody listens on; a real SQLite store."""

from __future__ import annotations

import logging

import devservices
from reconciler.model import SupervisorSpec
from tests.runtime.test_outage_log import LOGGER, _lines, _runtime, store  # noqa: F401 - the fixture


def _spec(broker: str) -> SupervisorSpec:
    return SupervisorSpec.from_document({
        "id": "clicks", "source": {"type": "kafka", "bootstrapServers": broker, "topic": "clicks"},
        "dataSchema": {"datasource": "clicks", "timestamp": {"column": "ts"}}})


def test_a_new_spec_that_fails_too_is_said_at_warning(store, tmp_path, caplog):  # noqa: F811
    caplog.set_level(logging.DEBUG, LOGGER)
    rt = _runtime(store, tmp_path, "clicks")
    rt.step()
    rt.step()
    assert [ln[0] for ln in _lines(caplog) if "cannot reach Kafka" in ln[2]] == [logging.WARNING, logging.DEBUG]

    # the operator answers the outage with another broker address: the manager sees the new
    # spec hash and calls reconsider() ("forget past failures"); that broker is down as well
    caplog.clear()
    other = f"127.0.0.1:{devservices.free_port()}"
    store.update_spec(_spec(other), None, actor="operator")
    rt.reconsider()
    rt.step()
    said = [ln for ln in _lines(caplog) if "cannot reach Kafka" in ln[2]]
    assert said and other in said[0][2], said  # the new spec's own failure (failure 1)
    assert said[0][0] == logging.WARNING, (
        f"the new spec's failure at {logging.getLevelName(said[0][0])}: {said[0][2]}")


def test_a_spec_that_fixes_the_outage_says_how_many_attempts_failed(store, tmp_path, caplog):  # noqa: F811
    from tests.runtime.test_outage_log import UpBroker

    caplog.set_level(logging.DEBUG, LOGGER)
    rt = _runtime(store, tmp_path, "clicks")
    for _ in range(3):
        rt.step()  # three failed attempts against the dead broker
    caplog.clear()
    store.update_spec(_spec(f"127.0.0.1:{devservices.free_port()}"), None, actor="operator")  # the fix
    rt.reconsider()
    rt._adapter_for = lambda rec: UpBroker()  # noqa: SLF001 - the new address answers
    rt.step()
    ended = [ln[2] for ln in _lines(caplog) if "working again" in ln[2]]
    assert ended, _lines(caplog)
    assert "after 3 failed attempts" in ended[0], ended[0]
