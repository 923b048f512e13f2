"""RabbitMQ Streams partitions, positions and range reads with rstream.

Each stream of a supervisor's stream set is one partition, named by the stream name.
The package, one module per concern:

* ``uri``: the stream URI to an endpoint (references resolved just before connecting;
  messages only ever show ``redact_uri``);
* ``bridge``: the private event loop that lets synchronous callers drive rstream;
* ``client``: connections per broker, subscriptions, rstream's exceptions translated;
* ``_rstream``: the only place that touches rstream's private attributes (checked by
  ``tests/streams/test_rstream_contract.py``);
* ``stats``: the StreamStats exchange (RabbitMQ >= 3.11);
* ``amqp``: AMQP 1.0 messages to ``(key, value)`` (rstream's decoder for odd shapes);
* ``arrow``: the numpy chunk cutter and the Arrow batch builder;
* ``adapter``: ``RabbitStreamAdapter`` (partitions, earliest, latest, offsets for time);
* ``reader``: ``RabbitRangeReader`` (exactly ``[start, end)`` as Arrow batches).

May import: rstream, pika, pyarrow, ``streams.base``, ``spec`` (secret references),
``model`` and ``errors``; nothing above them.
"""

from __future__ import annotations

from typing import Any

from reconciler.streams.rabbitmq.adapter import (
    DEFAULT_TIMEOUT,
    MAX_SUBSCRIPTIONS,
    RabbitStreamAdapter,
)
from reconciler.streams.rabbitmq.amqp import decode_chunk, decode_message
from reconciler.streams.rabbitmq.stats import decode_stream_stats_response
from reconciler.streams.rabbitmq.uri import StreamEndpoint, parse_stream_uri

__all__ = [
    "DEFAULT_TIMEOUT",
    "MAX_SUBSCRIPTIONS",
    "READ_CREDIT",
    "VECTOR_MIN_RECORDS",
    "RabbitRangeReader",
    "RabbitStreamAdapter",
    "StreamEndpoint",
    "chunk_arrays",
    "decode_chunk",
    "decode_message",
    "decode_stream_stats_response",
    "parse_stream_uri",
]

# The reader side imports numpy and pyarrow; the positions (the control plane) do not need
# them, so those names are imported on first use.
_LAZY = {
    "RabbitRangeReader": "reader",
    "READ_CREDIT": "reader",
    "chunk_arrays": "arrow",
    "VECTOR_MIN_RECORDS": "arrow",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
