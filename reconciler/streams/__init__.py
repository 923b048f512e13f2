"""Stream systems: one adapter module per system, behind ``base.StreamAdapter``."""

from __future__ import annotations

from reconciler.spec.model import KafkaSource, RabbitSource, Source
from reconciler.streams.base import StreamAdapter


def adapter_for(source: Source) -> StreamAdapter:
    """Build the adapter for a spec's source (secrets are resolved inside the adapter)."""
    if isinstance(source, KafkaSource):
        from reconciler.streams.kafka import KafkaAdapter

        return KafkaAdapter(source)
    if isinstance(source, RabbitSource):
        from reconciler.streams.rabbitmq import RabbitStreamAdapter

        return RabbitStreamAdapter(source)
    raise TypeError(f"unknown source type: {source!r}")
