"""``segments`` and ``verify``: the output tables as operators read them."""

from __future__ import annotations

import click

from reconciler.cli.base import _echo_json, cli, pass_ctx
from reconciler.observe import render


def open_tables(c):
    """The output tables' catalog for a command that reads (never creates) the database."""
    from reconciler.table.catalog import Tables

    if c.settings.catalog:  # the lake's catalog (what it cannot do yet it refuses, naming the setting)
        from reconciler.table.catalogs import open_tables as open_catalog

        return open_catalog(c.read_store.engine, c.settings.warehouse, c.settings.catalog,
                            reader_grace=c.settings.reader_grace)

    return Tables(c.read_store.engine, c.settings.warehouse, reader_grace=c.settings.reader_grace)


def _no_table(c, datasource: str) -> str:
    """Say which datasources there are: the argument is often a supervisor id by mistake."""
    actual = c.read_store.read_actual()
    sources = {sid: r.spec_document.get("dataSchema", {}).get("datasource") for sid, r in actual.supervisors.items()}
    known = sorted({d for d in sources.values() if d})
    text = f"No committed segments in datasource '{datasource}'."
    if datasource in sources and sources[datasource] and sources[datasource] != datasource:
        text += f" Supervisor '{datasource}' writes datasource '{sources[datasource]}'."
    if known:
        text += f" Datasources: {', '.join(known)}."
    return text


@cli.command(epilog="""\b
Examples:
  reconciler segments clicks
  reconciler segments clicks -o json | jq '[.[].rows] | add'
Read the same rows anywhere: pyiceberg's SqlCatalog on the metadata database (see docs/output.md).""")
@click.argument("datasource")
@click.option("-o", "--output", type=click.Choice(["text", "json"]), default="text", show_default=True)
@pass_ctx
def segments(c, datasource, output):
    """The data files of DATASOURCE's Iceberg table (its current snapshot): time interval,
    rows, size, the batch that committed each, and the offsets each file holds: the batch's
    ranges narrowed by the file's own __partition/__offset statistics (marked "the batch's"
    when the table has no such columns). A compacted file (batch -) shows its statistics alone:
    one partition's offsets, or for several partitions "0-3:[0,50000) (the file's bounds over
    partitions 0-3, not per partition)", bounds over the whole file."""
    from reconciler.table.files import data_files

    table = open_tables(c).load(datasource)
    files = data_files(table) if table is not None else []
    rows = [f.to_dict(datasource) for f in files]
    if output == "json":
        _echo_json(rows)
        return
    if not rows:
        click.echo(_no_table(c, datasource))
        return
    click.echo(render.table(["interval", "rows", "bytes", "batch", "offsets", "path"], [
        [f"{r['interval_start']}/{r['interval_end']}", r["rows"], r["bytes"], (r["batch_id"] or "-")[:12],
         _offsets_text(r), r["path"]] for r in rows]))
    click.echo(f"\n{len(rows)} file(s), {sum(r['rows'] for r in rows)} rows")


def _offsets_text(row: dict) -> str:
    """What a file holds, saying where it is known from when not from its own per-partition
    statistics: the batch's ranges, or (a compacted file of several partitions) bounds that
    hold over the whole file, not per partition."""
    if (b := row["bounds"]) is not None:
        (p_lo, p_hi), (o_lo, o_hi) = b["partitions"], b["offsets"]
        # half-open, as the batch lines' ranges are: one form within one command's output
        return f"{p_lo}-{p_hi}:[{o_lo},{o_hi + 1}) (the file's bounds over partitions {p_lo}-{p_hi}, not per partition)"
    text = ", ".join(f"{x['partition']}:[{x['start']},{x['end']})" for x in row["ranges"])
    if text and row["rangesFrom"] == "batch":  # no __partition/__offset statistics to narrow them
        text += " (the batch's)"
    return text

@cli.command(epilog="""\b
Exit status: 0 when every offset is in exactly one batch (gaps explained by the audit
log: retention loss, a reset without backfill, a cancelled backfill), 1 on any overlap,
unexplained gap or (with --deep) duplicated record.
Examples:
  reconciler verify clicks
  reconciler verify clicks --deep -o json""")
@click.argument("datasource")
@click.option("--deep", is_flag=True,
              help="Also count rows per (partition, offset) in the data files and dead letters "
                   "(needs __partition and __offset among the dimensions, no rollup).")
@click.option("-o", "--output", type=click.Choice(["text", "json"]), default="text", show_default=True)
@pass_ctx
def verify(c, datasource, deep, output):
    """Prove exactly once for DATASOURCE from its table alone: walk the offset ranges its
    snapshots carry, per supervisor (with its backfills) and partition, and report
    overlaps and gaps, each gap with the audit log's explanation."""
    from reconciler.table.catalog import deadletter_table
    from reconciler.table.verify import SupervisorFacts, lineage_of
    from reconciler.table.verify import verify as run_verify

    tables = open_tables(c)
    try:
        table = tables.load(datasource)
        dead_table = tables.load(deadletter_table(datasource))
    except OSError as exc:  # the catalog points at a metadata file that is not there
        if output == "json":
            _echo_json({"datasource": datasource, "ok": False, "error": f"the table cannot be read: {exc}"})
        else:
            click.echo(f"verify {datasource}:\nFAIL the table cannot be read: {exc}\nFAILED: see the lines marked FAIL")
        raise SystemExit(1) from None
    if table is None:
        raise click.ClickException(_no_table(c, datasource))
    store = c.read_store
    actual = store.read_actual()
    lineages = {lineage_of(sid) for sid in actual.supervisors
                if actual.supervisors[sid].spec_document.get("dataSchema", {}).get("datasource") == datasource}
    mine = [sid for sid in actual.supervisors if lineage_of(sid) in lineages]
    history = {sid: store.history(sid) for sid in mine}
    facts = {sid: SupervisorFacts(sid, r.kind, r.state, r.generation, actual.checkpoints.get(sid, {}),
                                  store.first_offsets(sid), r.end_offsets)
             for sid in mine if (r := actual.supervisors[sid])}
    report = run_verify(table, datasource, history, deep=deep, dead_table=dead_table, facts=facts)
    if output == "json":
        _echo_json(report.to_dict())
    else:
        click.echo(_report_text(report))
    if not report.ok:
        raise SystemExit(1)


def _report_text(report) -> str:
    lines = [f"verify {report.datasource}: {report.snapshots} batch snapshot(s)"
             + ("" if report.anchored else " (no supervisor in the database writes it: checkpoints not checked)")]
    rows = [[c.lineage, c.partition, f"[{c.start}, {c.end})", c.batches] for c in report.coverage]
    if rows:
        lines.append(render.table(["supervisor", "partition", "offsets covered", "batches"], rows))
    for f in report.findings:
        what = f"{f.kind} in {f.lineage} partition {f.partition}: [{f.start}, {f.end}) ({f.end - f.start} records)"
        if f.explanation:
            what += f": {f.explanation}"
        elif f.kind == "gap":
            what += ": UNEXPLAINED (no retention loss, reset or cancelled backfill in the audit log)"
        elif f.kind == "ahead":
            what += ": the table holds offsets past the checkpoint (committed by no checkpoint)"
        mark = "FAIL " if f.fails else "wait " if f.pending else "ok   "
        lines.append(mark + what)
    for path in report.missing_files[:20]:
        lines.append(f"FAIL missing file (referenced by the table): {path}")
    if len(report.missing_files) > 20:
        lines.append(f"FAIL ... and {len(report.missing_files) - 20} more missing file(s)")
    if report.deep is not None:
        d = report.deep
        if d.skipped:
            lines.append(f"deep check skipped: {d.skipped}")
        else:
            lines.append(f"deep: {d.rows} rows and {d.dead_letters} dead letters; "
                         f"{len(d.duplicates)} duplicated offset(s); {d.holes} offset(s) without a record "
                         "(transaction markers, tracking entries, compacted records)"
                         + (f"; {d.replayed} replayed from dead letters" if d.replayed else ""))
            for p, o, n in d.duplicates[:10]:
                lines.append(f"FAIL duplicate: partition {p} offset {o} appears {n} times")
            for p, n in d.missing:
                lines.append(f"FAIL missing: partition {p}: {n} record(s) the readers delivered are not in the table")
            if d.outside:
                lines.append(f"FAIL {d.outside} row(s) at offsets no committed batch read")
    explained = sum(1 for f in report.findings if not f.fails and not f.pending)
    waiting = sum(1 for f in report.findings if f.pending)
    tail = ", ".join(x for x in (f"{explained} explained gap(s)" if explained else "",
                                 f"{waiting} range(s) a running backfill has still to read" if waiting else "") if x)
    lines.append("OK: every offset in exactly one batch" + (f" ({tail})" if tail else "")
                 if report.ok else "FAILED: see the lines marked FAIL")
    return "\n".join(lines)
