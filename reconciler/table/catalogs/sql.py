"""``catalog: {type: sql}`` (the default): the tables in the metadata database, exactly as
before the setting existed. The adapter is ``catalog.Tables`` itself; its publish moves the
pointer inside the checkpoints' transaction (``runtime.publish_sql``)."""

from __future__ import annotations

from reconciler.table.catalog import Tables

__all__ = ["Tables"]
