"""Stream systems: one adapter module per system, behind ``base.StreamAdapter``."""

from __future__ import annotations

from reconciler.model import KafkaSource, RabbitSource, Source
from reconciler.streams.base import StreamAdapter


def adapter_for(source: Source, *, timeout: float | None = None) -> StreamAdapter:
    """Build the adapter for a spec's source (secrets are resolved inside the adapter);
    ``timeout`` bounds each broker call (default: the adapter's own)."""
    kw = {} if timeout is None else {"timeout": timeout}
    if isinstance(source, KafkaSource):
        from reconciler.streams.kafka import KafkaAdapter

        return KafkaAdapter(source, **kw)
    if isinstance(source, RabbitSource):
        from reconciler.streams.rabbitmq import RabbitStreamAdapter

        return RabbitStreamAdapter(source, **kw)
    raise TypeError(f"unknown source type: {source!r}")
