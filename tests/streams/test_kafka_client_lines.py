"""librdkafka's own lines while a broker refuses connections (issue 46, the newcomer's third
look: ``ERROR reconciler.streams.kafka.librdkafka: FAIL [...] Connection refused`` before a
command's clean ``Error:``, and three of them at the daemon's start). The product says an
unreachable broker in its own words; librdkafka's copies are DEBUG, anything else it says
keeps its level.

The broker is a real loopback port nobody listens on, as a dead broker looks to a client.
"""

from __future__ import annotations

import logging

import pytest

import devservices
from reconciler.errors import RetryableError
from reconciler.model import KafkaSource
from reconciler.streams.kafka import config, rdlog

LOGGER = "reconciler.streams.kafka.librdkafka"


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def captured():
    log = logging.getLogger(LOGGER)
    handler, level = _Records(), log.level
    log.addHandler(handler)
    yield handler, log
    log.removeHandler(handler)
    log.setLevel(level)


def _refused(timeout: float = 1.0) -> None:
    source = KafkaSource(bootstrap_servers=f"127.0.0.1:{devservices.free_port()}", topic="clicks")
    client = config.ClientConfig(source, timeout)
    consumer = client.consumer()
    try:
        with pytest.raises(Exception) as info:
            consumer.list_topics("clicks", timeout=timeout)
        assert isinstance(client.translate(info.value, "listing partitions"), RetryableError)
    finally:
        consumer.close()


def test_a_refused_connection_is_debug_not_error(captured):
    handler, log = captured
    log.setLevel(logging.DEBUG)
    _refused()
    fails = [r for r in handler.records if "Connection refused" in r.getMessage()]
    assert fails, [r.getMessage() for r in handler.records]  # librdkafka said it: at DEBUG
    assert {r.levelno for r in fails} == {logging.DEBUG}
    assert all(r.levelno < logging.WARNING for r in handler.records), [
        (r.levelname, r.getMessage()) for r in handler.records if r.levelno >= logging.WARNING]


def test_at_info_a_refused_connection_writes_nothing(captured):
    handler, log = captured
    log.setLevel(logging.INFO)
    bridge = next(f for f in log.filters if isinstance(f, rdlog.BrokerDownAsDebug))  # config.py's own
    held = bridge.held
    _refused()
    assert handler.records == []
    assert bridge.held > held  # counted, not written


def test_another_librdkafka_failure_keeps_its_level(captured):
    handler, log = captured
    log.setLevel(logging.INFO)
    log.error("%s [%s] %s", "FAIL", "stream-reconciler#consumer-1",
              "[thrd:b:9093/bootstrap]: b:9093/bootstrap: SSL handshake failed: certificate verify failed")
    log.error("%s [%s] %s", "ERROR", "stream-reconciler#consumer-1", "Connection refused by policy")
    assert [r.levelno for r in handler.records] == [logging.ERROR, logging.ERROR]
