"""``db upgrade``: migrations, then the one-off import of the layout before the tables."""

from __future__ import annotations

import click

from reconciler.cli.base import Context, cli, pass_ctx
from reconciler.cli.tables import open_tables
from reconciler.errors import ReconcilerError


@cli.group(epilog="Example: reconciler --db postgresql://reconciler@db/reconciler db upgrade")
def db():
    """Metadata database maintenance."""


@db.command("upgrade", epilog="Example: RECONCILER_DB=postgresql://reconciler@db/reconciler reconciler db upgrade")
@pass_ctx
def db_upgrade(c: Context):
    """Run schema migrations up to the newest revision (also done automatically at start), then
    import the committed segment files of the layout before the Iceberg tables
    (<segments>/<datasource>/time_chunk=...) into each datasource's table, once."""
    from reconciler.store.store import Store

    store = Store(c.settings.db_url)
    try:
        c.settings.state_path.mkdir(parents=True, exist_ok=True)
        click.echo(f"database at revision {store.migrate()}")
    except ReconcilerError as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        store.close()
    try:  # once: the committed files of the layout before the Iceberg tables, into their tables
        import_all(c)
    except ReconcilerError as exc:
        raise click.ClickException(str(exc)) from None


def import_all(c, *, dry_run: bool = False, echo=click.echo) -> list:
    """Import the old layout's committed segment files of every datasource into its table
    (``reconciler db upgrade`` calls this after the migrations). Idempotent."""
    from reconciler.table.upgrade import import_segments, old_layout_datasources

    if c.settings.remote_warehouse:  # the old layout was only ever written to a directory
        return []
    store = c.creating_store
    segments_dir = c.settings.segments_dir
    names = old_layout_datasources(segments_dir)
    if not names:
        return []
    tables = open_tables(c)
    actual = store.read_actual()
    results = []
    for name in names:
        granularity = None
        for r in actual.supervisors.values():
            ds = r.spec_document.get("dataSchema", {})
            if ds.get("datasource") == name:
                granularity = r.spec.data_schema.segment_granularity
                if r.kind == "main":
                    break
        result = import_segments(tables, store, segments_dir, name, granularity=granularity, dry_run=dry_run)
        results.append(result)
        if echo is not None:
            echo(f"{name}: {result.message}")
    return results
