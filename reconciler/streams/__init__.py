"""Stream systems: one adapter package per system, behind ``base.StreamAdapter``.

``kafka`` (confluent-kafka) and ``rabbitmq`` (rstream) each answer positions and read
exact offset ranges as Arrow batches; ``lagtime`` turns record times into lag in time.

May import: ``spec`` (secret references), ``settings``, ``faults``, ``model`` and
``errors``; imported by the control plane, the pipeline, the runtimes and ``observe``.
"""

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
