"""``status``, ``history``, ``reset``, ``suspend`` and ``resume``: one supervisor at a time."""

from __future__ import annotations

import json
import sys
import uuid
from datetime import UTC, datetime

import click

from reconciler.cli.base import (
    Context,
    _echo_json,
    _quiet,
    _refuse,
    _supervisor,
    _user,
    cli,
    pass_ctx,
)
from reconciler.errors import ReconcilerError
from reconciler.model import Position
from reconciler.observe import render


@cli.command(epilog="Example: reconciler status clicks -o json")
@click.argument("supervisor_id", required=False, metavar="[ID]")
@click.option("-o", "--output", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--no-lag", is_flag=True, help="Do not ask brokers for latest offsets (lag shown as -).")
@pass_ctx
def status(c: Context, supervisor_id, output, no_lag):
    """State, detailed state, per-partition checkpoint, latest and lag of supervisors.

    \b
    The words it uses:
      RUNNING        batches are being cut and published; also an IDLE supervisor that has
                     records behind it now (its next look, within taskDuration, reads them)
      IDLE           running, and its last look (every taskDuration) found nothing to read
      PENDING        created; a daemon (`reconciler run`) has not started it yet
      SUSPENDED      no batches (the file says suspended: true, or `reconciler suspend`)
      COMPLETED      a bounded (backfill) supervisor read its whole range
      UNHEALTHY_SUPERVISOR  the supervisor's own step fails: read its error. Shown from its
                     first failed step (the database records it after a few in a row);
                     retried with a back-off. The detail says why:
                     LOST_CONTACT_WITH_STREAM: at the supervisor's last look the broker did
                     not answer in time (or gave a passing error), whether or not it had
                     answered before; it recovers by itself once the broker answers.
                     UNABLE_TO_CONNECT_TO_STREAM: the stream cannot be read as configured,
                     which retrying does not fix (credentials or ACLs refused, a topic or
                     stream that does not exist, an invalid client setting): a person must
                     change something; it is still retried, and recovers once they have
      UNHEALTHY_TASKS  batches fail (a Spark or write error); retried with a back-off
      a line under the table says why a state shown differs from the one stored (-o json:
      state and detailedState as stored, the shown ones as shownState and
      shownDetailedState, the reason as stateNote)
    \b
      checkpoint     per partition, the next offset to ingest (everything before it is in the table)
      latest         the broker's end of the partition now (asked by this command)
      end            a bounded supervisor's last offset (exclusive): where a backfill stops
      lag            latest (or end) minus checkpoint, in records; lag age: how old the oldest
                     record not yet ingested is; ? when unknown (a broker down, or a source
                     that started over below the checkpoint: said under the table); - when
                     not asked (--no-lag); a completed backfill has lag 0 and lag age 0s:
                     its range is done
      records        records ingested so far, over all its batches (the unparseable
                     ones, counted apart under unparseable, included)
      [1] ...        an error (its last one, or the broker's) is said once, under the table,
                     for every supervisor it concerns
      (as of HH:MM:SSZ)  no daemon leads now: states are as the last one left them
      leader: none   the last daemon's lease ran out: after a clean stop too (it is not an error)
      spark:         the running daemon's Spark session as it recorded it (what its /healthz
                     says), or that no daemon runs and how the last one's session ended
    \b
    A reset's preview (reset --dry-run, plan, history), per partition:
      new            the checkpoint after the reset
      backfill       records the backfill supervisor will ingest: [checkpoint, new)
      skipped        records a forward jump without backfill leaves unread (--no-backfill)
      reread         records a rewind (--allow-rewind) reads a second time

    Without a daemon running, states are as last seen; lag is still asked of the brokers
    (--no-lag skips that).
    """
    from reconciler.observe.status import all_status, as_recorded

    try:
        lease = c.read_store.lease()
        live = bool(lease and lease.live(datetime.now(UTC)))
        # the brokers' clients' lines are held back by the CLI's setup: a broker that is down is said once, below
        items = all_status(c.read_store, supervisor_id, with_latest=not no_lag, live=live)
        daemons = c.read_store.daemons()
        webhooks = _webhooks(c)
    except ReconcilerError as exc:
        raise click.ClickException(str(exc)) from None
    if supervisor_id and not items:
        _refuse(f"no supervisor '{supervisor_id}'", output)
    for item in items:  # without a leader nothing updates states: they are what was last seen, and when
        item["stale"] = not live
    spark = _spark_status(c.settings, lease.holder if live else None, [d.daemon for d in daemons])
    if output == "json":
        leader = lease.to_dict() | {"live": live} if lease else None
        _echo_json({"supervisors": [as_recorded(i) for i in items], "leader": leader, "daemons": [d.to_dict() for d in daemons], "spark": spark,
                    "webhooks": webhooks})
    else:
        hint = None
        if not supervisor_id:
            from reconciler.spec.loader import nested_hint

            hint = nested_hint(c.settings.specs)
        if hint:  # the cause first: the advice to add a spec would send the reader the wrong way
            click.echo(f"note: {render.printable(hint)}" + ("\n" if items else ""))
        if items or not hint:
            click.echo(render.status_text(items, detail=bool(supervisor_id), live=live, lag_asked=not no_lag))
        if supervisor_id:
            resets = [e for e in c.read_store.history(supervisor_id) if e["action"] in ("reset", "reset-and-backfill")]
            if resets:
                click.echo(render.last_reset_text(resets[-1]))
        if lease and live:
            click.echo(f"\nleader: {lease.holder} (token {lease.token}, lease until {lease.expires_at:%H:%M:%S}Z)")
        elif lease:
            click.echo(f"\nleader: none: no daemon is running, or none has renewed its lease (the last, "
                       f"{lease.holder}, held it until {lease.expires_at:%H:%M:%S}Z; a clean stop ends it too)")
        for d in daemons:
            click.echo(f"daemon: {d.daemon} {d.role}")
        if webhooks:
            click.echo(render.webhooks_text(webhooks))
        click.echo(render.spark_text(spark))


def _webhooks(c: Context) -> list[dict]:
    """The delivery state of the webhook endpoints: those of these settings when they name any
    (the daemon's, when the command shares its configuration), else every endpoint recorded."""
    from reconciler.observe.webhook import endpoint_key

    mine = {endpoint_key(u) for u in c.settings.webhooks}
    return [w.to_dict() for w in c.read_store.webhook_cursors() if not mine or w.endpoint in mine]


def _spark_status(settings, leader: str | None, daemons: list[str]) -> dict:
    """The running daemon's Spark session as it recorded it (state dir), or why it is not known."""
    import socket

    from reconciler.observe.status import spark_state
    from reconciler.pipeline.spark import read_status_file

    seen = read_status_file(settings.state_path / "spark.json")
    return spark_state(seen, leader, daemons, settings.spark_master, socket.gethostname())


@cli.command(epilog="Example: reconciler history clicks")
@click.argument("supervisor_id", metavar="ID")
@click.option("-o", "--output", type=click.Choice(["text", "json"]), default="text", show_default=True)
@pass_ctx
def history(c: Context, supervisor_id, output):
    """The audit log of one supervisor: creates, updates, resets with offsets, terminations."""
    entries = c.read_store.history(supervisor_id)
    if not entries and c.read_store.get(supervisor_id) is None:
        _refuse(f"no supervisor '{supervisor_id}'", output)
    if output == "json":
        _echo_json(entries)
    else:
        click.echo(render.history_text(entries))


# -- reset ------------------------------------------------------------------------------

def parse_position(text: str) -> Position:
    """latest | earliest | ISO time | -2h | {"0": 1200} | {"offsets": {...}} | {"shiftBy": -100}.

    JSON positions are checked against the same schema as a marker's ``resetTo``, so
    ``{"0": 1.7}``, ``{"0": true}``, ``{"offsets": ..., "shiftBy": 3}`` and ``-1e400`` are
    refused with the reason instead of being rounded, dropped or overflowing."""
    from reconciler.spec.timeparse import TimestampError, parse_timestamp
    from reconciler.spec.validate import validate_data

    t = text.strip()
    if t in ("latest", "earliest"):
        return Position(t)
    if t.startswith("{"):
        try:
            doc = json.loads(t)
        except (json.JSONDecodeError, RecursionError) as exc:
            raise click.BadParameter(f"not JSON: {exc}", param_hint="'--to'") from None
        if isinstance(doc, dict) and not ({"offsets", "shiftBy", "timestamp"} & doc.keys()):
            doc = {"offsets": doc}
        problems = validate_data({"resetTo": doc}, "marker", path="--to")
        if problems:
            reasons = "; ".join(f"{p.field.removeprefix('resetTo').lstrip('.') or 'position'}: {p.message}"
                                for p in problems)
            raise click.BadParameter(reasons, param_hint="'--to'")
        return Position.from_document(doc)
    try:
        parse_timestamp(t, datetime.now(UTC))
    except TimestampError as exc:
        raise click.BadParameter(f"{exc}; or use latest, earliest, or offsets JSON", param_hint="'--to'") from None
    return Position("timestamp", timestamp=t)


@cli.command(epilog="""\b
Examples:
  reconciler reset clicks --to latest --dry-run
  reconciler reset clicks --to latest --backfill --reason "lag alarm INC-42"
  reconciler reset clicks --to 2026-11-20T10:00:00Z --allow-rewind
  reconciler reset clicks --to '{"0": 1200, "1": 900}'
  reconciler reset clicks --to '{"shiftBy": -1000}' --allow-rewind""")
@click.argument("supervisor_id", metavar="ID")
@click.option("--to", "to", required=True, metavar="POSITION",
              help="latest | earliest | ISO time or -2h | offsets JSON {\"0\": 1200} | {\"shiftBy\": N}.")
@click.option("--backfill/--no-backfill", default=True, show_default=True,
              help="Ingest what a forward jump skips with a bounded backfill supervisor.")
@click.option("--backfill-task-count", type=click.IntRange(1, 1024), help="taskCount of the backfill supervisor.")
@click.option("--allow-rewind", is_flag=True, help="Allow moving checkpoints backwards (records are read again).")
@click.option("--dry-run", is_flag=True, help="Show per-partition offsets and counts; change nothing.")
@click.option("--reason", help="Why; recorded in the audit log.")
@click.option("-o", "--output", type=click.Choice(["text", "json"]), default="text", show_default=True)
@pass_ctx
def reset(c: Context, supervisor_id, to, backfill, backfill_task_count, allow_rewind, dry_run, reason, output):
    """Move a supervisor's checkpoint, exactly once, optionally with a backfill.

    Captures the stream's offsets, then in ONE transaction reads the checkpoint under
    lock, creates the bounded backfill supervisor ID-backfill-N for the skipped range,
    moves the checkpoint and fences any in-flight batch. Works in any state, including
    SUSPENDED. The backfill is ingested by the daemon (`reconciler run`).
    """
    from reconciler.control.apply import Applier
    from reconciler.control.plan import Action, ActionKind
    from reconciler.control.positions import capture
    from reconciler.control.requests import from_cli
    from reconciler.control.resets import compute_reset, fill_from, renew
    from reconciler.runtime import startedover

    position = parse_position(to)
    try:
        rec = c.store.get(supervisor_id)
    except click.ClickException as exc:  # no database yet: -o json still answers in JSON
        _refuse(exc.message, output)
    if rec is None or rec.kind != "main":
        _refuse(f"no main supervisor '{supervisor_id}' (see `reconciler status`)", output)
    started_over = startedover.started_over(c.store, rec, position)
    req = from_cli(supervisor_id, position, operation_id=uuid.uuid4().hex[:12], backfill=backfill,
                   backfill_task_count=backfill_task_count, allow_rewind=allow_rewind, reason=reason,
                   started_over=started_over)
    try:
        if dry_run:
            pos, _ = capture(rec.spec, position, datetime.now(UTC))
            current = fill_from(c.store.checkpoints(supervisor_id), pos, rec.spec.start_from)  # the reset transaction's rule
            outcome = compute_reset(position, current, pos, backfill=backfill, allow_rewind=allow_rewind)
            if started_over:  # as the reset transaction will (Store.apply_reset)
                outcome = renew(outcome, started_over, f"{supervisor_id}@{rec.generation + 1}")
            doc = {"dryRun": True, "supervisor": supervisor_id, "position": position.to_document(),
                   "partitions": [p.to_dict() for p in outcome.partitions], "backfillRecords": outcome.backfill_records,
                   "startedOver": started_over, "warnings": list(outcome.warnings), "errors": list(outcome.errors)}
            _print_reset(doc, output)
            sys.exit(1 if outcome.errors else 0)
        kind = ActionKind.RESET_AND_BACKFILL if backfill else ActionKind.RESET
        with _quiet("reconciler.control.apply"):  # its outcome is printed below, once
            [result] = Applier(c.store, actor=f"cli:{req.source}", state_dir=c.settings.state_path,
                               warehouse=c.settings.warehouse, catalog=c.settings.catalog).apply(
                [Action(kind, supervisor_id, req.describe(), request=req)])
    except ReconcilerError as exc:
        _refuse(str(exc), output)
    if not result.ok:
        _refuse(result.message, output, supervisor=supervisor_id)
    _print_reset({"dryRun": False, "message": result.message, **result.details}, output)


def _print_reset(doc, output) -> None:
    if output == "json":
        _echo_json(doc)
        return
    if doc.get("message"):
        click.echo(render.printable(doc["message"]))
    click.echo(render.reset_table(doc["partitions"]))
    for w in doc.get("warnings", []) + doc.get("errors", []):
        click.echo(f"! {render.printable(w)}")
    if doc["dryRun"]:
        click.echo(f"dry run: backfill would ingest {doc['backfillRecords']} records; nothing changed")


# -- operator control ---------------------------------------------------------------------

@cli.command("suspend", epilog='Example: reconciler suspend clicks --reason "INC-42: broker overloaded"')
@click.argument("supervisor_id", metavar="ID")
@click.option("--reason", required=True, help="Why; recorded in the audit log and shown in status and plan.")
@pass_ctx
def suspend_cmd(c: Context, supervisor_id, reason):
    """Suspend a supervisor now, whatever its file says, until `reconciler resume ID`.

    For a main supervisor this is an operator override kept in the database: `status`
    and `plan` show it as drift from the file ("suspended by operator: REASON") and no
    pass resumes it. The checkpoint is kept; an in-flight batch still publishes. For a
    backfill supervisor it is `reconciler backfill suspend`.
    """
    rec = _supervisor(c, supervisor_id)
    try:
        if rec.kind == "backfill":
            c.store.control_backfill(supervisor_id, "suspend", reason, actor=f"cli:{_user()}")
        else:
            c.store.suspend_by_operator(supervisor_id, reason, actor=f"cli:{_user()}")
    except ReconcilerError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"{supervisor_id}: suspended by operator: {render.printable(reason)}"
               + ("" if rec.kind == "backfill" else f" (drift from the file until `reconciler resume {supervisor_id}`)"))


@cli.command("resume", epilog='Example: reconciler resume clicks --reason "INC-42 resolved"')
@click.argument("supervisor_id", metavar="ID")
@click.option("--reason", help="Why; recorded in the audit log.")
@pass_ctx
def resume_cmd(c: Context, supervisor_id, reason):
    """Lift `reconciler suspend`: the spec file is the desired state again.

    The supervisor resumes unless its file says `suspended: true`.
    """
    rec = _supervisor(c, supervisor_id)
    try:
        if rec.kind == "backfill":
            c.store.control_backfill(supervisor_id, "resume", reason, actor=f"cli:{_user()}")
            click.echo(f"{supervisor_id}: resumed")
            return
        lifted = c.store.resume_by_operator(supervisor_id, reason, actor=f"cli:{_user()}",
                                            file_suspended=rec.spec.suspended)
    except ReconcilerError as exc:
        raise click.ClickException(str(exc)) from None
    if not lifted:
        raise click.ClickException(f"'{supervisor_id}' has no operator override: its file decides "
                                   f"(suspended: {str(rec.spec.suspended).lower()})")
    click.echo(f"{supervisor_id}: override lifted; "
               + ("its file says suspended: true, so it stays SUSPENDED" if rec.spec.suspended else "resuming"))
