"""The Alembic migrations build exactly the schema of ``reconciler/store/tables.py``.

Checked on SQLite and PostgreSQL: a column added to ``tables.py`` without a
migration (or the other way round) fails here.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from reconciler.model import SupervisorSpec
from reconciler.store.store import Store
from reconciler.store.tables import metadata


@pytest.fixture
def migrated(db_url: str) -> Iterator[Store]:
    store = Store(db_url)
    assert store.migrate() == "0006"
    try:
        yield store
    finally:
        store.close()


def _generic(t: sa.types.TypeEngine) -> str:
    """A database-neutral name of a column type."""
    if isinstance(t, sa.BigInteger):
        return "bigint"
    if isinstance(t, sa.Integer):
        return "integer"
    if isinstance(t, sa.DateTime):
        return "datetime"
    if isinstance(t, sa.Text) or (isinstance(t, sa.String) and t.length is None):
        return "text"
    if isinstance(t, sa.String):
        return f"varchar({t.length})"
    return type(t).__name__.lower()


def test_tables(migrated: Store):
    names = set(sa.inspect(migrated.engine).get_table_names())
    assert names == set(metadata.tables) | {"alembic_version"}
    assert set(metadata.tables) == {"supervisors", "spec_versions", "checkpoints", "batches", "segments",
                                    "audit_log", "requests", "leases", "overrides", "writes", "batch_totals",
                                    "lag_observations", "webhook_cursors", "lag_samples"}


@pytest.mark.parametrize("table", sorted(metadata.tables))
def test_columns(migrated: Store, table: str):
    insp = sa.inspect(migrated.engine)
    declared = metadata.tables[table]
    got = {c["name"]: c for c in insp.get_columns(table)}
    assert list(got) == [c.name for c in declared.columns]  # same names, same order
    for col in declared.columns:
        have = got[col.name]
        # a variant (lag_samples' id: BIGINT on PostgreSQL, SQLite's rowid INTEGER) as this database has it
        assert _generic(have["type"]) == _generic(col.type.dialect_impl(migrated.engine.dialect)), f"{table}.{col.name}"
        if not col.primary_key:
            assert have["nullable"] == col.nullable, f"{table}.{col.name}"
    pk = insp.get_pk_constraint(table)["constrained_columns"]
    assert pk == [c.name for c in declared.primary_key.columns]
    indexed = {tuple(ix["column_names"]) for ix in insp.get_indexes(table)}
    assert indexed == {tuple(c.name for c in ix.columns) for ix in declared.indexes}


def test_server_default_of_epoch(migrated: Store):
    [epoch] = [c for c in sa.inspect(migrated.engine).get_columns("supervisors") if c["name"] == "epoch"]
    assert "1" in str(epoch["default"])


def test_autogenerate_finds_no_difference(migrated: Store):
    with migrated.engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True})
        diff = compare_metadata(ctx, metadata)
    assert diff == []


def test_timestamps_keep_their_time_zone(migrated: Store):
    """DateTime(timezone=True) round-trips an aware UTC value on both databases."""
    spec = SupervisorSpec.from_document({
        "id": "tz", "source": {"type": "kafka", "bootstrapServers": "h:9092", "topic": "t"},
        "dataSchema": {"datasource": "tz", "timestamp": {"column": "ts"}},
    })
    at = datetime(2026, 11, 20, 10, 30, 15, 123456, tzinfo=UTC)
    migrated.create_supervisor(spec, None, actor="test", now=at)
    rec = migrated.get("tz")
    assert rec.created_at == at
    assert rec.updated_at.utcoffset().total_seconds() == 0
