"""Table locations as local paths (the one place that knows how pyiceberg spells them)."""

from __future__ import annotations

from pathlib import Path

# The Iceberg namespace of every table, ``<warehouse>/default/<table>``: here, not in
# ``catalog``, so recovery finds the tables' directories without importing pyiceberg
# (0.7 s of a fresh daemon's start, before its Spark session could start).
NAMESPACE = "default"
DEADLETTER_SUFFIX = "_deadletter"  # datasource D's dead letters are the table D_deadletter
CATALOG = "reconciler"  # the SQL catalog's name in ``iceberg_tables`` (pyiceberg's SqlCatalog)


def catalog_names(engine) -> list[str]:
    """The tables of the SQL catalog, read with one query: what `compact` and `maintain` need
    to say "No tables yet" without importing pyiceberg (seconds on a busy host). None of them
    when the catalog's table does not exist yet."""
    import sqlalchemy as sa

    if not sa.inspect(engine).has_table("iceberg_tables"):
        return []
    with engine.connect() as c:
        return sorted(r[0] for r in c.execute(sa.text(
            "SELECT table_name FROM iceberg_tables WHERE catalog_name = :c AND table_namespace = :n"),
            {"c": CATALOG, "n": NAMESPACE}))


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
