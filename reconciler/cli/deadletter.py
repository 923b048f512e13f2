"""``deadletter list`` and ``deadletter replay``: the records a spec could not parse, and
bringing them back, exactly once, once the spec is fixed (``table.replay``)."""

from __future__ import annotations

import click

from reconciler.cli.base import _echo_json, _refuse, _user, cli, pass_ctx
from reconciler.errors import ReconcilerError
from reconciler.observe import render


@cli.group(epilog="""\b
Examples:
  reconciler deadletter list clicks
  reconciler deadletter replay clicks --dry-run
  reconciler deadletter replay clicks --reason 'unparseable timestamp'""")
def deadletter():
    """The dead letters of a datasource (records that did not parse): list them, replay them."""


def _tables(c):
    from reconciler.cli.tables import open_tables

    return open_tables(c)


@deadletter.command("list", epilog="Example: reconciler deadletter list clicks -o json")
@click.argument("datasource")
@click.option("-o", "--output", type=click.Choice(["text", "json"]), default="text", show_default=True)
@pass_ctx
def list_(c, datasource, output):
    """Counts of DATASOURCE's pending dead letters by reason and by supervisor, the first
    records of each reason (values cut short, secrets hidden), how many were replayed, and
    how many no replay can bring back, and why."""
    from reconciler.store.replays import replayed_totals
    from reconciler.table import deadletters

    store = c.read_store
    actual = store.read_actual().supervisors
    writers = [sid for sid, r in actual.items() if r.spec_document.get("dataSchema", {}).get("datasource") == datasource]
    tables = _tables(c)
    try:
        table, files = deadletters.read(tables, store, datasource,
                                        fallback=deadletters.lineage_owner(actual, datasource))
    except (OSError, ReconcilerError) as exc:
        _refuse(f"the dead letters of {datasource} cannot be read: {exc}", output)
    if table is None and not writers:
        _refuse(f"no datasource '{datasource}' (no supervisor writes it and it has no dead-letter table)", output)
    replayed = sum(n for per in replayed_totals(store, datasource).values() for n in per.values())
    doc = deadletters.listing(datasource, files, replayed, schemas=deadletters.lineage_schemas(actual, datasource))
    if output == "json":
        _echo_json(doc)
        return
    click.echo(_list_text(doc))


def _list_text(doc) -> str:
    head = (f"{doc['datasource']}: {doc['deadLetters']} dead letter(s) pending, "
            f"{doc['replayed']} replayed already")
    if not doc["deadLetters"]:
        return head
    lines = [head, "", render.table(["supervisor", "dead letters"],
                                    [[s["supervisor"], s["count"]] for s in doc["bySupervisor"]]), ""]
    for r in doc["byReason"]:
        lines.append(f"{r['count']:>8}  {r['reason']}")
        lines.append(render.table(["partition", "offset", "key", "value"],
                                  [[x["partition"], x["offset"], x["key"] or "-", x["value"] or "-"]
                                   for x in r["records"]]))
    for s in doc["cannotComeBack"]:
        lines.append(f"\n{s['count']} will stay whatever the spec: {s['why']}")
    lines.append(f"\nReplay them once the spec is fixed: reconciler deadletter replay {doc['datasource']} --dry-run")
    return "\n".join(lines)


@deadletter.command(epilog="""\b
Exit status: 0 when the replay committed (or, with --dry-run, could run), 1 when it was
refused (no dead letters, an unknown datasource or supervisor, an invalid spec) or gave up.
Examples:
  reconciler deadletter replay clicks --dry-run
  reconciler deadletter replay clicks --supervisor clicks --reason 'unparseable timestamp'""")
@click.argument("datasource")
@click.option("--reason", metavar="TEXT", help="Only dead letters whose reason contains TEXT.")
@click.option("--supervisor", "supervisor_id", metavar="ID",
              help="Only dead letters read by supervisor ID (a main one: with its backfills).")
@click.option("--dry-run", is_flag=True, help="Say how many would come back and why the rest would stay.")
@click.option("-o", "--output", type=click.Choice(["text", "json"]), default="text", show_default=True)
@pass_ctx
def replay(c, datasource, reason, supervisor_id, dry_run, output):
    """Parse DATASOURCE's dead letters again with the current spec of the supervisor that read
    them; append the ones that now parse to the table and remove them from the dead letters in
    one commit (exactly once, whatever runs beside it). The rest stay, with their new reason;
    those no spec can bring back (an undecodable stream entry's, or all under a spec timed by
    __stream_time, which dead letters do not keep) are left as they are, and said so."""
    from reconciler.table.replay import replay as run_replay

    try:
        result = run_replay(_tables(c), c.store, datasource, reason=reason, supervisor=supervisor_id,
                            dry_run=dry_run, actor=_user())
    except ReconcilerError as exc:
        _refuse(str(exc), output)
    except OSError as exc:  # a file of the tables or of the replay's own write could not be read or written
        _refuse(f"the replay of {datasource} stopped on a file: {exc}; it commits all or nothing, so check "
                "the segments directory (space, permissions) and run it again", output)
    ok = result.committed or dry_run or (result.replayed == 0 and "gave up" not in result.message
                                         and "not committed" not in result.message)
    if output == "json":
        _echo_json({"ok": ok, **result.to_dict()})
    else:
        verb = "would come back" if dry_run else "came back"
        click.echo(f"{datasource}: {result.replayed} dead letter(s) {verb}; {result.stayed} "
                   f"{'would stay' if dry_run else 'stayed'}")
        for k, n in result.stayed_by_reason.items():
            click.echo(f"  {n:>8}  {render.printable(k)}")
        if result.message:
            click.echo(render.printable(result.message))
    if not ok:
        raise SystemExit(1)
