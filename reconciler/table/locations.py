"""Table locations as local paths (the one place that knows how pyiceberg spells them)."""

from __future__ import annotations

from pathlib import Path

# The Iceberg namespace of every table, ``<warehouse>/default/<table>``: here, not in
# ``catalog``, so recovery finds the tables' directories without importing pyiceberg
# (0.7 s of a fresh daemon's start, before its Spark session could start).
NAMESPACE = "default"


def local_path(location: str) -> Path:
    """A ``file://`` location (or a plain path) as a local path.

    Taken as pyiceberg's file IO takes it: the path after ``file://`` as it is, never
    percent-decoded (pyiceberg writes ``file:///a%20b`` to a directory named ``a%20b``), so
    every clean-up looks where the files are."""
    return Path(local_name(location))


def local_name(location: str) -> str:
    """``local_path`` as a string: for loops over every live file of a table (``verify``,
    orphan clean-up), where building a ``Path`` cost more than the ``stat`` itself."""
    if location.startswith("file://"):
        return location[len("file://"):]
    if "://" not in location:
        return location
    raise ValueError(f"{location}: only a local (or shared, mounted) warehouse is supported here")
