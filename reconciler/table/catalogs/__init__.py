"""The catalog adapters, one per ``catalog`` setting type, chosen once by ``open_tables``.

- ``sql`` (``catalog.Tables``): pyiceberg's SQL catalog in the metadata database; the
  publish moves the table's pointer inside the checkpoints' transaction.
- ``external`` (``external.ExternalTables``): pyiceberg's Glue or REST catalog; the table
  commits first, fenced by a tag (``fence.py``), and the database follows.

Each adapter names its commit protocol (``PROTOCOL``); the runtime picks the matching
publish module once (``runtime.publishing``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any


def open_tables(engine, warehouse: str | os.PathLike[str], catalog: Mapping[str, Any] | None = None, **options):
    """The tables of the ``catalog`` setting (empty: the metadata database's, as always)."""
    kind = (catalog or {}).get("type", "sql")
    if kind == "sql":
        from reconciler.table.catalogs.sql import Tables

        return Tables(engine, warehouse, **options)
    from reconciler.table.catalogs.external import ExternalTables

    return ExternalTables(engine, warehouse, catalog, **options)
