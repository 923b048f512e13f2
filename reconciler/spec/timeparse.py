"""Timestamps written in specs and markers: ISO-8601, or relative to now.

Used when a spec or marker is validated (a timestamp that does not parse, or lies
in the future, is a problem in that file) and when a timestamp position is turned
into offsets. ``now`` is always passed in, so callers decide the clock.

Accepted: ISO-8601 dates and times (``2026-11-20``, ``2026-11-20T10:00:00Z``,
``2026-11-20 10:00:00+01:00``; a time without an offset is UTC), and durations
back from now: ``-30s``, ``-30m``, ``-2h``, ``-1d``, ``-1w``, ``-1h30m``.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

_RELATIVE = re.compile(r"^-(?:[0-9]+(?:\.[0-9]+)?[smhdw])+$")
_FORWARD = re.compile(r"^\+?(?:[0-9]+(?:\.[0-9]+)?[smhdw])+$")
_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)([smhdw])")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
EXAMPLES = "ISO-8601 such as 2026-11-20T10:00:00Z, or relative such as -2h, -30m, -1d"
# Stream positions are found by milliseconds since the epoch, and Kafka reads the negative
# values as "latest" (-1) and "earliest" (-2): a time before the epoch must be refused,
# never handed on.
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class TimestampError(ValueError):
    """The text is not a timestamp we accept; the message says why and what would be."""


def parse_timestamp(text: str, now: datetime, *, allow_future: bool = False) -> datetime:
    """The UTC time ``text`` names; relative times count back from ``now``."""
    now = _utc(now)
    raw = text.strip() if isinstance(text, str) else text
    if not isinstance(raw, str) or not raw:
        raise TimestampError(f"not a timestamp: {text!r} (use {EXAMPLES})")
    if _RELATIVE.match(raw):
        seconds = sum(float(n) * _UNIT[u] for n, u in _PART.findall(raw))
        try:
            return _after_epoch(now - timedelta(seconds=seconds), raw)
        except (OverflowError, ValueError):
            raise TimestampError(f"{raw} reaches before 1970-01-01T00:00:00Z (the earliest "
                                 "time a stream position can name)") from None
    if _FORWARD.match(raw):
        raise TimestampError(
            f"relative times count back from now and start with '-' (e.g. -{raw.lstrip('+')})"
        )
    try:
        when = datetime.fromisoformat(raw)
    except ValueError:
        raise TimestampError(f"not a timestamp: {text!r} (use {EXAMPLES})") from None
    try:
        when = _after_epoch(_utc(when), raw)
    except OverflowError:  # e.g. 0001-01-01T00:00:00+14:00 has no UTC equivalent
        raise TimestampError(f"timestamp {raw} is out of range (its UTC time is not a valid date)") from None
    if not allow_future and when > now:
        # No "now" in the message: a file's error must read the same every tick, or the
        # supervisor would be re-marked invalid (and its audit log grow) on each one.
        raise TimestampError(
            f"timestamp {raw} is in the future (a start point must lie in the past)"
        )
    return when


def _after_epoch(when: datetime, raw: str) -> datetime:
    if when < EPOCH:
        raise TimestampError(f"timestamp {raw} lies before 1970-01-01T00:00:00Z (the earliest time "
                             "a stream position can name)")
    return when


def _utc(value: datetime) -> datetime:
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value.astimezone(UTC)
