"""Table locations as local paths (the one place that knows how pyiceberg spells them)."""

from __future__ import annotations

from pathlib import Path


def local_path(location: str) -> Path:
    """A ``file://`` location (or a plain path) as a local path.

    Taken as pyiceberg's file IO takes it: the path after ``file://`` as it is, never
    percent-decoded (pyiceberg writes ``file:///a%20b`` to a directory named ``a%20b``), so
    every clean-up looks where the files are."""
    if location.startswith("file://"):
        return Path(location[len("file://"):])
    if "://" not in location:
        return Path(location)
    raise ValueError(f"{location}: only a local (or shared, mounted) warehouse is supported here")
