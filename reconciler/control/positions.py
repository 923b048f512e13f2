"""Capturing stream positions for a reset: the I/O half of a startpoint.

Asks the supervisor's stream (through its adapter) for earliest, latest and, for a
timestamp position, the offsets at that time; also what ``startFrom`` would give for
partitions without a checkpoint. The pure half is ``resets.compute_reset``.
"""

from __future__ import annotations

from datetime import datetime

from reconciler.control import resets
from reconciler.control.resets import Positions
from reconciler.errors import PermanentError
from reconciler.model import Position, SupervisorSpec
from reconciler.spec.timeparse import TimestampError, parse_timestamp
from reconciler.streams import adapter_for
from reconciler.streams.base import StreamAdapter


def timestamp_ms(text: str, now: datetime) -> int:
    try:
        return int(parse_timestamp(text, now).timestamp() * 1000)
    except TimestampError as exc:
        raise PermanentError(str(exc)) from None


def resolve(adapter: StreamAdapter, position: Position, now: datetime) -> dict[str, int] | None:
    """Offsets a time-based position names, or None for positions that are not time-based."""
    if position.kind == "timestamp":
        return adapter.offsets_for_time(timestamp_ms(position.timestamp or "", now))
    return None


def start_offsets(adapter: StreamAdapter, spec: SupervisorSpec, now: datetime, latest=None, earliest=None) -> dict[str, int]:
    """Where a partition without a checkpoint starts (``startFrom``): ``resets.start_offsets``
    with what it needs asked of the broker (only what ``startFrom`` uses, once)."""
    kind = spec.start_from.kind
    at_time = (resolve(adapter, spec.start_from, now) or {}) if kind == "timestamp" else None
    if kind == "latest" and latest is None:
        latest = adapter.latest()
    if kind not in ("latest", "timestamp") and earliest is None:
        earliest = adapter.earliest()
    captured = Positions(earliest=earliest or {}, latest=latest or {}, start_from=at_time)
    return dict(resets.start_offsets(spec.start_from, captured) or {})


def capture(spec: SupervisorSpec, position: Position, now: datetime) -> tuple[Positions, dict[str, int]]:
    """(positions for ``compute_reset``, startFrom offsets for missing checkpoints)."""
    adapter = adapter_for(spec.source)
    try:
        earliest = adapter.earliest()
        latest = adapter.latest()
        for_time = resolve(adapter, position, now)
        initial = start_offsets(adapter, spec, now, latest=latest, earliest=earliest)
    finally:
        adapter.close()
    return Positions(earliest=earliest, latest=latest, for_time=for_time, start_from=initial), initial
