"""``RabbitStreamAdapter.records_at`` (the fingerprint of a record, ``runtime.fingerprint``)
against a real RabbitMQ node: the record's own offset with its chunk's time, None where the
stream holds no record. (Below the first chunk kept, where the subscription is served from a
later chunk, the answer is None too: ``held_time``, tests/runtime/test_fingerprint.py.)
"""

from __future__ import annotations

import time

import pytest

import devservices
from reconciler.model import RabbitSource
from reconciler.streams import adapter_for


@pytest.mark.rabbitmq
@pytest.mark.integration
def test_rabbit_records_at_answers_the_offset_asked_or_none(rabbit_node, stream):
    a, b = stream(), stream()
    before = int(time.time() * 1000)
    devservices.produce_rabbit(rabbit_node.stream_uri, a, [(f"k{i}", b"{}") for i in range(30)])
    after = int(time.time() * 1000)
    adapter = adapter_for(RabbitSource(uri=rabbit_node.stream_uri, streams=(a, b)), timeout=5.0)
    got = adapter.records_at({a: 29, b: 0})
    assert got[b] is None  # an empty stream holds nothing
    assert got[a][0] == 29 and before - 2000 <= got[a][1] <= after + 2000, got
    assert adapter.records_at({a: 29}) == {a: got[a]}  # the same record: the same answer
    assert adapter.records_at({a: 30}) == {a: None}  # the end
    assert adapter.record_times({a: 29}) == {a: got[a][1]}  # the lag's answer is unchanged
