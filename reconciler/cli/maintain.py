"""``compact`` and ``maintain``: table maintenance from the command line.

The commands take the group's ``Context`` (``ctx.obj``: settings, store) and follow its
conventions: text or ``-o json``, a refusal as ``Error: ...`` (or ``{"ok": false, "error": ...}``)
and exit 1.
"""

from __future__ import annotations

import re
import sys
from datetime import timedelta
from typing import Any

import click

from reconciler.cli.base import _echo_json, _refuse, cli
from reconciler.cli.tables import open_tables

_DURATION = re.compile(r"^\s*(?P<n>[0-9]+(?:\.[0-9]+)?)\s*(?P<unit>ms|s|m|h|d|w)\s*$")
_UNIT = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_SIZE = re.compile(r"^\s*(?P<n>[0-9]+(?:\.[0-9]+)?)\s*(?P<unit>|b|k|kb|kib|m|mb|mib|g|gb|gib)\s*$", re.I)
_BYTES = {"": 1, "b": 1, "k": 1024, "kb": 1000, "kib": 1024, "m": 1024**2, "mb": 1000**2, "mib": 1024**2,
          "g": 1024**3, "gb": 1000**3, "gib": 1024**3}


class Duration(click.ParamType):
    """500ms, 30s, 15m, 1h, 7d, 2w."""

    name = "DURATION"

    def convert(self, value, param, ctx):
        if isinstance(value, timedelta):
            return value
        from reconciler.model import MAX_DURATION, MAX_DURATION_TEXT

        m = _DURATION.match(str(value))
        if not m:
            self.fail(f"{value!r} is not a duration (use e.g. 30m, 12h, 7d)", param, ctx)
        seconds = float(m["n"]) * _UNIT[m["unit"]]
        if not seconds <= MAX_DURATION:  # timedelta would overflow into a traceback
            self.fail(f"{value!r} is too long: at most {MAX_DURATION_TEXT}", param, ctx)
        return timedelta(seconds=seconds)


class Size(click.ParamType):
    """128MB, 64MiB, 1G, 1048576."""

    name = "SIZE"

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            return value
        m = _SIZE.match(str(value))
        if not m:
            self.fail(f"{value!r} is not a size (use e.g. 128MB, 512MiB, 1G)", param, ctx)
        size = int(float(m["n"]) * _BYTES[m["unit"].lower()])
        if size < 1024:
            self.fail(f"{value!r} is too small for a data file (at least 1KiB)", param, ctx)
        return size


def parse_duration(text: str) -> timedelta:
    """``7d`` -> 7 days (also ms, s, m, h, w)."""
    return Duration().convert(text, None, None)


def datasource_rollup(store, datasource: str):
    """The rollup of the specs that write ``datasource`` (``Rollup.of_all``: every spec's
    metrics; for a name two give, its main supervisor's, preferably a live one), or None.
    Backfills share their main's dataSchema."""
    from reconciler.table.compact import Rollup

    records = [r for r in store.read_actual().supervisors.values()
               if r.spec_document.get("dataSchema", {}).get("datasource") == datasource]
    if not records:
        return None
    records.sort(key=lambda r: (r.kind != "main", r.state == "TERMINATED",
                                -(r.updated_at.timestamp() if r.updated_at else 0)))
    return Rollup.of_all(r.spec.data_schema for r in records)


# -- compact ------------------------------------------------------------------------------

@cli.command("compact", epilog="""\b
Examples:
  reconciler compact clicks --dry-run          which partitions would be rewritten
  reconciler compact clicks                    rewrite them (safe while the daemon ingests)
  reconciler compact clicks --lateness 6h -o json | jq '.partitions[] | [.partition, .filesBefore, .filesAfter]'
  (the daemon does the same on its own: see the compactInterval setting in docs/settings.md)""")
@click.argument("datasource")
@click.option("--all-closed", is_flag=True, default=True, show_default=True,
              help="Compact every closed time partition (the only mode for now; the flag is the default).")
@click.option("--lateness", type=Duration(), default="1h", show_default=True,
              help="A partition is closed once its end is this far in the past: late records may still "
                   "arrive before that, and compacting an open partition would only be redone.")
@click.option("--target-file-size", type=Size(), default="128MiB", show_default=True,
              help="Size of the files written, in Parquet bytes (estimated from the inputs); files under half of it "
                   "count as small.")
@click.option("--no-rollup", is_flag=True,
              help="Only merge files, even when the datasource's spec says rollup: true.")
@click.option("--dry-run", is_flag=True, help="Show the partitions and files that would be rewritten; change nothing.")
@click.option("-o", "--output", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.pass_obj
def compact_cmd(c, datasource, all_closed, lateness, target_file_size, no_rollup, dry_run, output):
    """Rewrite the small files of a datasource's closed time partitions into large ones.

    Each batch adds a few small files per time partition; reading many small files is
    slow. Compaction reads the files of every closed partition (one whose end is more
    than --lateness ago) and writes them again as few large files, in ONE table commit:
    a reader sees the old files or the new ones, never both, never neither.

    With rollup (the spec's dataSchema.granularity.rollup: true) it also aggregates
    across batches, so the table ends with one row per (time, dimensions): counts and
    sums add up, mins and maxes combine.

    It runs safely while the daemon ingests: if a batch is published meanwhile, the same
    merge is staged again on the new table (a batch only adds files; they wait for the next
    run) and retried; it plans again when another compaction took its files. It never touches
    offsets or checkpoints, and `reconciler verify` ignores its snapshot. The replaced
    files stay on disk while a kept snapshot (one of the newest snapshotsKept, a tag's or
    a branch's) still lists them; they go once those snapshots are expired.
    """
    from reconciler.errors import ReconcilerError

    _known_or_refuse(c, datasource, output)  # before importing the table modules: seconds on a busy host
    from reconciler.table.compact import compact
    from reconciler.table.reports import MaintenanceError

    try:
        tables = open_tables(c)
        if tables.load(datasource) is None:
            _refuse(f"no table '{datasource}' (datasources: {', '.join(_datasources(tables)) or 'none yet'})", output)
        rollup = None if no_rollup else datasource_rollup(c.read_store, datasource)
        result = compact(tables, datasource, store=c.store, rollup=rollup, lateness=lateness, target_file_size=target_file_size,
                         dry_run=dry_run)
    except (ReconcilerError, MaintenanceError) as exc:
        _refuse(str(exc), output)
    failed = not dry_run and result.partitions and not result.committed
    if output == "json":
        _echo_json({"ok": not failed, **result.to_dict()})
    else:
        _print_compact(result)
    sys.exit(1 if failed else 0)


def _print_compact(result) -> None:
    from reconciler.observe import render

    if result.partitions:
        rows = [[p.partition, str(p.files_before), str(p.rows_before), _human(p.bytes_before),
                 "-" if result.dry_run else str(p.files_after), "-" if result.dry_run else str(p.rows_after),
                 "-" if result.dry_run else _human(p.bytes_after)] for p in result.partitions]
        click.echo(render.table(["partition", "files", "rows", "size", "files after", "rows after", "size after"],
                                rows))
    tail = f"; {result.open_partitions} partition(s) still open" if result.open_partitions else ""
    click.echo(f"{result.table}: {result.message}{' (rollup)' if result.rollup else ''}{tail}")


def _datasources(tables) -> list[str]:
    from reconciler.table.locations import DEADLETTER_SUFFIX

    return [n for n in tables.names() if not n.endswith(DEADLETTER_SUFFIX)]


def _known_or_refuse(c, datasource: str | None, output: str) -> list[str]:
    """The catalog's datasources, read with one query; a DATASOURCE it does not hold is refused
    here, and an empty catalog is said here, without importing pyiceberg."""
    from reconciler.table.locations import DEADLETTER_SUFFIX, catalog_names

    # the lake's catalog lists its own (one call); the metadata database's, one query
    names = open_tables(c).names() if c.settings.catalog else catalog_names(c.read_store.engine)
    sources = [n for n in names if not n.endswith(DEADLETTER_SUFFIX)]
    if datasource and datasource not in names:
        _refuse(f"no table '{datasource}' (datasources: {', '.join(sources) or 'none yet'})", output)
    return names


def _human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024
    return str(n)


# -- maintain -----------------------------------------------------------------------------

@cli.command("maintain", epilog="""\b
Examples:
  reconciler maintain --dry-run                what would go, for every table
  reconciler maintain clicks                   expire and clean one datasource (and its dead letters)
  reconciler maintain --older-than 30d --retain-last 500
  reconciler maintain --no-expire --orphans-older-than 3d -o json""")
@click.argument("datasource", required=False)
@click.option("--older-than", type=Duration(), default=None,
              help="Expire snapshots older than this (time travel to them is no longer possible) "
                   "[default: the daemon's snapshotRetention, 1h unless set].")
@click.option("--retain-last", type=click.IntRange(1), default=None,
              help="Keep at least this many of the newest snapshots, however old "
                   "[default: the daemon's snapshotsKept, 25 unless set].")
@click.option("--orphans-older-than", type=Duration(), default="1d", show_default=True,
              help="Delete unreferenced files only when older than this (never a batch still being published).")
@click.option("--no-expire", is_flag=True, help="Do not expire snapshots.")
@click.option("--no-orphans", is_flag=True, help="Do not remove orphan files.")
@click.option("--dry-run", is_flag=True, help="Show what would be expired and deleted; change nothing.")
@click.option("-o", "--output", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.pass_obj
def maintain_cmd(c, datasource, older_than, retain_last, orphans_older_than, no_expire, no_orphans, dry_run, output):
    """Expire old snapshots and delete orphan files of the tables (all, or one DATASOURCE).

    Expiry drops snapshots older than --older-than that are not among the last
    --retain-last, then deletes the files only they referenced (for instance the small
    files a compaction replaced). The current snapshot, and any snapshot a reader may
    still hold, are kept. The offset ranges of expired snapshots are kept in the table
    (property reconciler.expired-ranges), so `reconciler verify` still proves exactly
    once.

    Orphan clean-up deletes files under a table's directory that no snapshot or metadata
    file references (a batch whose publish lost, a crashed compaction), when older than
    --orphans-older-than. It never deletes files of a batch the database says committed.

    Its defaults are the daemon's own (snapshotRetention, snapshotsKept): a run by hand
    removes what the leader's maintenance would, no more, so with `maintainInterval: 0` it
    is the daemon's maintenance run from cron. Keep more for time travel with larger values.

    Safe while the daemon runs. Run it daily, e.g. from a systemd timer or cron.
    """
    from reconciler.errors import ReconcilerError

    if not _known_or_refuse(c, datasource, output) and not c.settings.remote_warehouse:
        if output == "json":
            _echo_json({"ok": True, "dryRun": dry_run, "tables": []})
        else:
            click.echo("No tables yet.")
        sys.exit(0)
    from reconciler.table.expire import expire_snapshots
    from reconciler.table.orphans import remove_orphans
    from reconciler.table.reports import MaintenanceError, table_names

    if older_than is None:
        older_than = timedelta(seconds=c.settings.snapshot_retention)
    if retain_last is None:
        retain_last = max(1, c.settings.snapshots_kept)
    docs = []
    try:
        tables = open_tables(c)
        names = table_names(tables, datasource)
        if datasource and not names:
            _refuse(f"no table '{datasource}' (datasources: {', '.join(_datasources(tables)) or 'none yet'})", output)
        for name in names:
            doc: dict[str, Any] = {"table": name}
            if not no_expire:
                doc["expire"] = expire_snapshots(tables, name, store=c.read_store, older_than=older_than, retain_last=retain_last,
                                                 dry_run=dry_run)
            if not no_orphans:
                doc["orphans"] = remove_orphans(tables, name, older_than=orphans_older_than,
                                                store=c.store, dry_run=dry_run)
            docs.append(doc)
    except (ReconcilerError, MaintenanceError) as exc:
        _refuse(str(exc), output)
    except OSError as exc:  # the warehouse's store cannot be reached: its own words, one line, no traceback
        from reconciler.table.storage import unreachable_reason

        _refuse(unreachable_reason(exc) or f"the warehouse {c.settings.warehouse} cannot be read: "
                f"{exc.strerror or exc.__class__.__name__}", output)
    failed = any("expire" in d and d["expire"].expired_snapshots and not d["expire"].committed and not dry_run
                 for d in docs)
    if output == "json":
        _echo_json({"ok": not failed, "dryRun": dry_run,
                    "tables": [{k: (v.to_dict() if hasattr(v, "to_dict") else v) for k, v in d.items()}
                               for d in docs]})
    else:
        if not docs:
            click.echo("No tables yet.")
        for d in docs:
            parts = [d[k].message for k in ("expire", "orphans") if k in d]
            click.echo(f"{d['table']}: {'; '.join(parts)}")
    sys.exit(1 if failed else 0)
