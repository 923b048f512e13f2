"""Inline SVG time charts for the status pages: lag in records, lag in time, records ingested
per second, with a time axis, a value scale and the resets and backfills marked (issue 46.4).

Pure and self-contained: a chart is a string of SVG drawn on the server, with no script, no
style sheet and nothing fetched, so the page works offline, behind a strict proxy and in a
terminal browser that ignores it. Samples are ``(time, value)``; an unknown value (the broker
did not answer) breaks the line instead of drawing a false 0.

The x axis spans the data actually held, from the first sample to now (at least ``MIN_SPAN``,
at most ``WINDOW``): a fixed hour made five minutes of data a 5 px sliver at the right edge.
Ticks fall on round minutes (1, 5, 10 or 15 apart, at most ``MAX_TICKS`` and never closer than
a label's width), the y scale ends on a round value (sub-second ones too), and every label sits
outside the plot so none is drawn over the line. No label runs into another either (issue
46.4): the title and the "now · max" values share the header line only when a generous estimate
of their widths (``text_width``: DejaVu Sans, the widest of the usual fallbacks) fits, else the
values take a second line; marker letters that would touch stack downwards. Points are thinned
to one per two pixels (the largest of lags, the mean of rates), which bounds a page of many
supervisors whatever ``lagInterval`` is.

Records ingested per second have one definition, ``ingest_rates``, drawn by both pages.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from html import escape

WINDOW = 3600.0  # seconds shown at most, ending now (the observer keeps an hour)
MIN_SPAN = 300.0  # seconds shown at least
STEPS = (60, 300, 600, 900)  # tick spacings, seconds
RATE_STEPS = (5, 10, 15, 30, 60)  # seconds per bucket of records ingested per second
MAX_TICKS = 6
LEFT, RIGHT, TOP, BOTTOM = 44, 16, 22, 16  # margins: the scale, the title and the time axis live there
LINE = 12  # a header line's height: values that do not fit beside the title go below it
TICK_ROOM = 40  # px per tick label ("12:45" and a gap)
MARKS = {"reset": ("R", "#b3261e"), "backfill": ("B", "#6a3fb5")}

Points = Sequence[tuple[datetime, float | None]]


@dataclass(frozen=True)
class Marker:
    """A reset or a backfill on the time axis; ``text`` is its tooltip."""

    at: datetime
    kind: str  # a key of MARKS
    text: str = ""


def timechart(samples: Points, now: datetime, *, label: str, unit: str = "", markers: Sequence[Marker] = (),
              width: int = 300, height: int = 110, color: str = "#2c6fbb", css_class: str = "chart",
              reduce: str = "max", since: datetime | None = None) -> str:
    """A line over the data held (``span``, or from ``since``), its scale, its time axis and the
    markers in range. ``unit``: ``""`` (a count), ``"s"`` (a duration) or ``"/s"`` (a rate);
    ``reduce``: how the samples of one pixel column are thinned (``max`` or ``mean``)."""
    start = since or span_start([t for t, _ in samples], now)
    shown = [(t, v) for t, v in samples if start <= t <= now]
    known = [v for _, v in shown if v is not None]
    top = max(known, default=0.0)
    scale = nice_max(top, unit)
    last = samples[-1][1] if samples else None
    values = f"now {fmt(last, unit)} · max {fmt(top if known else None, unit)}"
    # beside the title when both fit with a gap, else on a line of their own: never over each other
    stacked = LEFT + text_width(label) + 10 + text_width(values) > width - RIGHT
    head = TOP + (LINE if stacked else 0)
    pw, ph = width - LEFT - RIGHT, height - head - BOTTOM
    seconds = (now - start).total_seconds()

    def x(t: datetime) -> float:
        return LEFT + (t - start).total_seconds() / seconds * pw

    def y(v: float) -> float:
        return head + ph - min(v, scale) / scale * ph

    runs = _runs(_thin(shown, x, reduce))
    text = f"{label}: {values.replace(' ·', ',')}"
    out = [f'<svg class="{css_class}" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(text)}" font-family="system-ui,sans-serif" '
           f'font-size="10" data-points="{sum(len(r) for r in runs)}" data-span="{int(seconds)}">',
           f"<title>{escape(text)}</title>",
           f'<text class="label" x="{LEFT}" y="12" fill="#333">{escape(label)}</text>',
           f'<text class="values" x="{width - RIGHT}" y="{12 + (LINE if stacked else 0)}" fill="#555" '
           f'text-anchor="end">{escape(values)}</text>',
           f'<rect x="{LEFT}" y="{head}" width="{pw}" height="{ph}" fill="#fbfbfb" stroke="#ddd"/>']
    out += _scale(scale, unit, y, width)
    out += _axis(start, now, x, height, head, max(2, pw // TICK_ROOM))
    for r in runs:
        pts = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in r)
        if len(r) == 1:
            out.append(f'<circle cx="{x(r[0][0]):.1f}" cy="{y(r[0][1]):.1f}" r="2" fill="{color}"/>')
            continue
        base = head + ph
        out.append(f'<polygon fill="{color}" fill-opacity="0.12" stroke="none" '
                   f'points="{x(r[0][0]):.1f},{base} {pts} {x(r[-1][0]):.1f},{base}"/>')
        out.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{pts}"/>')
    if not known:
        out.append(f'<text x="{LEFT + pw / 2:.0f}" y="{head + ph / 2 + 3:.0f}" fill="#888" text-anchor="middle">'
                   "no samples</text>")
    out += _markers([m for m in markers if start <= m.at <= now], x, height, width, head)
    out.append("</svg>")
    return "".join(out)


def span_start(times: Sequence[datetime], now: datetime) -> datetime:
    """Where the x axis begins: the first sample, kept between ``MIN_SPAN`` and ``WINDOW`` before now."""
    first = min(times, default=now)
    return now - timedelta(seconds=min(WINDOW, max(MIN_SPAN, (now - first).total_seconds())))


def ticks(start: datetime, now: datetime, most: int = MAX_TICKS) -> list[datetime]:
    """Round minutes between ``start`` and ``now``: the smallest of ``STEPS`` giving at most
    ``most`` (and ``MAX_TICKS``) intervals."""
    total = (now - start).total_seconds()
    most = min(most, MAX_TICKS)
    step = next((s for s in STEPS if total / s <= most), STEPS[-1])
    first = math.ceil(start.timestamp() / step) * step
    return [datetime.fromtimestamp(t, UTC) for t in range(first, int(now.timestamp()) + 1, step)]


def nice_max(top: float, unit: str = "") -> float:
    """The top of the scale: ``top`` rounded up to 1, 2, 2.5 or 5 times a power of ten (or, for
    durations, to a round number of seconds, minutes or hours)."""
    if top <= 0:
        return 1.0
    if unit == "s":
        for step in (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400):
            if top <= step:
                return float(step)
        return math.ceil(top / 86400) * 86400.0
    power = 10 ** math.floor(math.log10(top))
    return next(m * power for m in (1, 2, 2.5, 5, 10) if top <= m * power * (1 + 1e-9))


def rate_step(times: Sequence[datetime], columns: int = 60) -> int:
    """The seconds per bucket of ``ingest_rates``: the smallest of ``RATE_STEPS`` that cuts the
    samples' own extent (first to last, at most ``WINDOW``) into at most ``columns``. Taken from
    the samples, never from "now" or a chart's width: a finished range keeps its buckets."""
    extent = min(WINDOW, (times[-1] - times[0]).total_seconds()) if times else 0.0
    return next((s for s in RATE_STEPS if extent / s <= columns), RATE_STEPS[-1])


def ingest_rates(totals: Sequence[tuple[datetime, int | None]], now: datetime, *,
                 done: bool = False) -> list[tuple[datetime, float | None]]:
    """Records ingested per second: the one definition both pages chart (issue 46.3; they once
    drew different figures for the same supervisor at the same moment).

    ``totals`` are the lag observer's samples of the records ingested so far. The growth between
    two samples is spread evenly over the time between them, summed in buckets of ``rate_step``
    seconds that begin at multiples of it since the epoch, and divided by the part of the bucket
    those pairs cover; each point sits at its bucket's end (``now`` for the bucket under way).
    The buckets were once 60 slices of the span ending now: their edges moved every rendering,
    so a completed backfill's peak read 11,587, 9,252, 10,376... a minute apart, and two pages
    fetched in the same second disagreed (issue 46.4). Now each bucket's figure depends on the
    samples alone. A bucket no pair of known totals covers is unknown (a gap, never a false 0),
    as is a pair whose total went down, except the bucket after the last sample (the time since
    the last observation, not yet measured: left out, so "now" does not flicker to "?" between
    two rounds). ``done``: nothing is ingested after the last sample (a completed backfill), so
    the buckets after it are a known 0 and "now" reads 0/s. A backfill first seen after it had
    read everything rises from its creation's sample (nothing ingested) to its end."""
    if not totals:
        return []
    step = rate_step([t for t, _ in totals])
    base = math.floor(totals[0][0].timestamp() / step) * step  # a fixed clock boundary
    count = max(1, math.ceil((now.timestamp() - base) / step))  # up to the bucket that holds now
    got, covered = [0.0] * count, [0.0] * count
    for (t0, a), (t1, b) in zip(totals, totals[1:], strict=False):
        if a is None or b is None or b < a or t1 <= t0:
            continue
        lo, hi = t0.timestamp() - base, min(t1.timestamp() - base, count * step)
        rate = (b - a) / (t1 - t0).total_seconds()
        for i in range(max(0, int(lo // step)), min(count, math.ceil(hi / step))):
            part = min(hi, (i + 1) * step) - max(lo, i * step)
            if part > 0:
                got[i] += rate * part
                covered[i] += part
    last = totals[-1][0].timestamp() - base if totals[-1][1] is not None else math.inf
    out: list[tuple[datetime, float | None]] = []
    for i in range(count):
        at = min(datetime.fromtimestamp(base + step * (i + 1), UTC), now)
        if covered[i] > 1e-9:
            out.append((at, got[i] / covered[i]))
        elif done and (i + 1) * step > last:
            out.append((at, 0.0))
        elif not last <= i * step < last + step:
            out.append((at, None))
    if done and out and out[-1][1] != 0.0:
        out.append((now, 0.0))  # "now" is this instant's rate, not the mean of the bucket it ended in
    return out


def text_width(text: str) -> float:
    """A generous estimate of ``text``'s width in px at the charts' 10 px font: DejaVu Sans, the
    widest fallback of ``system-ui`` on the machines the pages are read on (Debian's chromium)."""
    narrow, wide = " ,.:;·()[]/|!'ijlrtf", "mwMW%"
    return sum(3.6 if c in narrow else 9.8 if c in wide else 6.6 for c in text)


def fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "?"
    if unit == "s":
        return duration(value)
    if unit == "/s":
        return f"{value:,.1f}/s" if value < 10 else f"{value:,.0f}/s"
    return f"{int(value):,}"


def short(value: float, unit: str) -> str:
    """A scale label: ``88000`` -> ``88k``; durations as ``15m``, ``1h``."""
    if unit == "s":
        v = int(value)
        if 0 < value < 0.1:
            return f"{value * 1000:g}ms"
        if value < 1:
            return f"{value:g}s"
        if v < 60:
            return f"{v}s"
        if v < 3600:
            return f"{v // 60}m" + (f"{v % 60}s" if v % 60 else "")
        return f"{v // 3600}h" + (f"{v % 3600 // 60}m" if v % 3600 else "")
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= div:
            return f"{value / div:g}{suffix}"
    return f"{value:g}"


def duration(seconds: float) -> str:
    """``0.04`` -> ``40ms``; ``0.7`` -> ``0.7s``; ``42`` -> ``42s``; ``150`` -> ``2m 30s``; ``5040``
    -> ``84m 00s``; ``7440`` -> ``2h 04m``. A sub-second lag read "0s", as if nothing waited."""
    if 0 < seconds < 0.0995:
        return f"{seconds * 1000:.0f}ms" if seconds >= 0.0005 else "<1ms"
    if 0 < seconds < 0.95:
        return f"{seconds:.1f}s"
    seconds = int(round(seconds) if seconds < 1 else seconds)
    if seconds < 90:
        return f"{seconds}s"
    if seconds < 5400:
        return f"{seconds // 60}m {seconds % 60:02d}s"
    return f"{seconds // 3600}h {seconds % 3600 // 60:02d}m"


def _thin(points: Points, x: Callable[[datetime], float], reduce: str) -> list[tuple[datetime, float | None]]:
    """One point per two pixels: the bucket's largest (or mean) known value at its last time;
    a bucket with unknown values only stays unknown (a break)."""
    out: list[tuple[datetime, float | None]] = []
    bucket: list[tuple[datetime, float | None]] = []
    key = None
    for t, v in [*points, (None, None)]:
        k = None if t is None else int(x(t) // 2)
        if bucket and k != key:
            vals = [b for _, b in bucket if b is not None]
            value = (max(vals) if reduce == "max" else sum(vals) / len(vals)) if vals else None
            out.append((bucket[-1][0], value))
            bucket = []
        key = k
        if t is not None:
            bucket.append((t, v))
    return out


def _runs(points: Sequence[tuple[datetime, float | None]]) -> list[list[tuple[datetime, float]]]:
    runs: list[list[tuple[datetime, float]]] = [[]]
    for t, v in points:
        if v is None:
            if runs[-1]:
                runs.append([])
        else:
            runs[-1].append((t, v))
    return [r for r in runs if r]


def _scale(scale: float, unit: str, y: Callable[[float], float], width: int) -> list[str]:
    out = []
    for v in (0.0, scale / 2, scale):
        yy = y(v)
        if v:
            out.append(f'<line x1="{LEFT}" y1="{yy:.1f}" x2="{width - RIGHT}" y2="{yy:.1f}" stroke="#e6e6e6"/>')
        out.append(f'<text x="{LEFT - 4}" y="{yy + 3:.1f}" fill="#666" text-anchor="end">{escape(short(v, unit))}</text>')
    return out


def _axis(start: datetime, now: datetime, x: Callable[[datetime], float], height: int, head: int = TOP,
          most: int = MAX_TICKS) -> list[str]:
    out = []
    base = height - BOTTOM
    for t in ticks(start, now, most):
        xx = x(t)
        out.append(f'<line x1="{xx:.1f}" y1="{head}" x2="{xx:.1f}" y2="{base + 3}" stroke="#e6e6e6"/>')
        # centred under its line (the right margin holds half a label): ticks never crowd each other
        out.append(f'<text class="tick" x="{xx:.1f}" y="{height - 3}" fill="#666" text-anchor="middle">'
                   f"{t:%H:%M}</text>")
    return out


def _markers(markers: Sequence[Marker], x: Callable[[datetime], float], height: int, width: int,
             head: int = TOP) -> list[str]:
    out = []
    base = height - BOTTOM
    placed: list[tuple[float, float, int]] = []  # the letters' extents and rows: one that would touch goes below
    for m in sorted(markers, key=lambda m: m.at):
        letter, color = MARKS.get(m.kind, ("?", "#555"))
        xx = x(m.at)
        tip = m.text or f"{m.kind} at {m.at:%H:%M:%S}Z"
        tx, anchor = (xx - 3, "end") if xx + 12 > width - RIGHT else (xx + 3, "start")  # inside the plot
        lo, hi = (tx - 9, tx) if anchor == "end" else (tx, tx + 9)
        row = next(r for r in range(len(placed) + 1)
                   if all(r != pr or hi + 2 < plo or lo - 2 > phi for plo, phi, pr in placed))
        placed.append((lo, hi, row))
        out.append(f'<g class="marker {escape(m.kind)}"><title>{escape(tip)}</title>'
                   f'<line x1="{xx:.1f}" y1="{head}" x2="{xx:.1f}" y2="{base}" stroke="{color}" '
                   'stroke-dasharray="3,2" stroke-width="1.2"/>'
                   f'<path d="M{xx - 4:.1f},{base + 6} L{xx + 4:.1f},{base + 6} L{xx:.1f},{base} Z" fill="{color}"/>'
                   f'<text x="{tx:.1f}" y="{head + 10 + 11 * row}" fill="{color}" font-weight="600" '
                   f'text-anchor="{anchor}">{letter}</text></g>')
    return out
