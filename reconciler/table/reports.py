"""What maintenance runs share: results as camelCase JSON documents, the tables a run
covers, and the one error type."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from reconciler.table.catalog import (
    Tables,
    deadletter_table,
)

log = logging.getLogger(__name__)

class MaintenanceError(Exception):
    """A maintenance step that could not be done (and changed nothing)."""


def _iso(dt: datetime) -> str:
    return dt.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _camel(doc: Any) -> Any:
    if isinstance(doc, dict):
        return {_camel_key(k): _camel(v) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_camel(v) for v in doc]
    return doc


def _camel_key(key: str) -> str:
    head, *rest = key.split("_")
    return head + "".join(w.capitalize() for w in rest)


def table_names(tables: Tables, datasource: str | None = None) -> list[str]:
    """The tables a maintenance run covers: a datasource's table and its dead letters, or all."""
    if datasource is None:
        return tables.names()
    return [n for n in (datasource, deadletter_table(datasource)) if tables.load(n) is not None]
