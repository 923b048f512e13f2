"""Small inline SVG charts for the status pages: lag in records and in time over the last hour.

Pure and self-contained: a chart is a string of SVG drawn on the server, with no script, no
style sheet and nothing fetched, so the page works offline, behind a strict proxy and in a
terminal browser that ignores it. Samples are ``(time, value)``; an unknown value (the broker
did not answer) breaks the line instead of drawing a false 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from html import escape

WINDOW = 3600.0  # seconds shown, ending now


def sparkline(samples: Sequence[tuple[datetime, float | None]], now: datetime, *, label: str, unit: str = "",
              width: int = 180, height: int = 40, color: str = "#2c6fbb", css_class: str = "chart") -> str:
    """A line over the last hour with its maximum and latest value as text (and as the title)."""
    known = [(t, v) for t, v in samples if v is not None and (now - t).total_seconds() <= WINDOW]
    top = max((v for _, v in known), default=0.0)
    last = samples[-1][1] if samples else None
    scale = top if top > 0 else 1.0
    pad = 2

    def xy(t: datetime, v: float) -> str:
        x = width - (now - t).total_seconds() / WINDOW * (width - 2 * pad) - pad
        y = height - pad - (v / scale) * (height - 2 * pad)
        return f"{max(pad, x):.1f},{y:.1f}"

    runs: list[list[str]] = [[]]
    for t, v in samples:
        if (now - t).total_seconds() > WINDOW:
            continue
        if v is None:
            if runs[-1]:
                runs.append([])
            continue
        runs[-1].append(xy(t, v))
    lines = "".join(f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{" ".join(r)}"/>'
                    if len(r) > 1 else f'<circle cx="{r[0].split(",")[0]}" cy="{r[0].split(",")[1]}" r="1.5" '
                    f'fill="{color}"/>' for r in runs if r)
    text = f"{label}: now {_fmt(last, unit)}, max {_fmt(top if known else None, unit)} (last hour)"
    return (f'<svg class="{css_class}" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(text)}" '
            f'data-points="{sum(len(r) for r in runs)}">'
            f"<title>{escape(text)}</title>"
            f'<rect x="0" y="0" width="{width}" height="{height}" fill="#fafafa" stroke="#ddd"/>'
            f'<line x1="{pad}" y1="{height - pad}" x2="{width - pad}" y2="{height - pad}" stroke="#ccc"/>'
            f"{lines}"
            f'<text x="{pad + 2}" y="11" font-size="10" fill="#555">{escape(label)} max {escape(_fmt(top if known else None, unit))}</text>'
            "</svg>")


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "?"
    if unit == "s":
        return duration(value)
    return f"{int(value):,}"


def duration(seconds: float) -> str:
    """``42`` -> ``42s``; ``150`` -> ``2m 30s``; ``5040`` -> ``1h 24m``."""
    seconds = int(seconds)
    if seconds < 90:
        return f"{seconds}s"
    if seconds < 5400:
        return f"{seconds // 60}m {seconds % 60:02d}s"
    return f"{seconds // 3600}h {seconds % 3600 // 60:02d}m"
