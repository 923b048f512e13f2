"""``backfill list|suspend|resume|cancel``: operator control of bounded supervisors."""

from __future__ import annotations

import click

from reconciler.cli.base import Context, _echo_json, _user, cli, pass_ctx
from reconciler.errors import ReconcilerError
from reconciler.observe import render


@cli.group("backfill", epilog="Example: reconciler backfill list")
def backfill_group():
    """Operator control of backfill supervisors (bounded, created by resets)."""


@backfill_group.command("list", epilog="Example: reconciler backfill list -o json")
@click.option("-o", "--output", type=click.Choice(["text", "json"]), default="text", show_default=True)
@pass_ctx
def backfill_list(c: Context, output):
    """Every backfill supervisor: its main, state, progress and ETA."""
    from reconciler.observe.status import all_status

    items = [s for s in all_status(c.read_store, with_latest=False) if s["kind"] == "backfill"]
    if output == "json":
        _echo_json(items)
        return
    if not items:
        click.echo("No backfill supervisors.")
        return
    rows = []
    for s in items:
        b = s["backfill"]
        eta = "" if b["etaSeconds"] is None or b["complete"] else f"{b['etaSeconds']:.0f}s"
        rows.append([s["id"], s["parent"], s["state"], f"{b['done']}/{b['total']}", eta, s["lastError"] or ""])
    click.echo(render.table(["backfill", "of", "state", "done", "eta", "error"], rows, wrap_last=60))


def _backfill_verb(verb: str, help_text: str, example: str):
    @backfill_group.command(verb, help=help_text, epilog=f"Example: {example}")
    @click.argument("backfill_id", metavar="ID")
    @click.option("--reason", required=verb != "resume", help="Why; recorded in the audit log.")
    @pass_ctx
    def command(c: Context, backfill_id, reason):
        from reconciler.control.apply import Applier

        applier = Applier(c.store, actor=f"cli:{_user()}", state_dir=c.settings.state_path,
                          warehouse=c.settings.warehouse, catalog=c.settings.catalog)
        try:  # a cancel fences an external catalog's table first (Applier.control_backfill)
            details = applier.control_backfill(backfill_id, verb, reason)
        except ReconcilerError as exc:
            raise click.ClickException(str(exc)) from None
        text = {"suspend": "suspended", "resume": "resumed", "cancel": "cancelled"}[verb]
        click.echo(f"{backfill_id}: {text}")
        if details.get("unreadRanges"):
            ranges = ", ".join(f"{p}: [{s}, {e})" for p, (s, e) in sorted(details["unreadRanges"].items()))
            click.echo(f"left unread ({details['unreadRecords']} records, recorded in the audit log): {ranges}")
    return command


_backfill_verb("suspend", "Pause a backfill: no batches until resumed; its progress is kept.",
               'reconciler backfill suspend clicks-backfill-1 --reason "broker overloaded"')
_backfill_verb("resume", "Resume a suspended backfill from where it stopped.",
               "reconciler backfill resume clicks-backfill-1")
_backfill_verb("cancel", "Stop a backfill for good; the range it left unread is recorded in the audit log "
               "(and shown by history) so the gap is explained, never silent.",
               'reconciler backfill cancel clicks-backfill-1 --reason "data not needed"')
