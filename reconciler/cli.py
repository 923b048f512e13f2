"""The ``reconciler`` command line (click). Commands are thin: they load settings,
call the same functions the daemon calls, and print tables or JSON.

Exit codes: 0 success; 1 an error (invalid files, failed actions, unreachable
database); 2 for ``plan``: changes pending (like ``terraform plan -detailed-exitcode``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import click

from reconciler import logs, render
from reconciler import settings as settings_mod
from reconciler.errors import ReconcilerError
from reconciler.model import Position
from reconciler.spec import secrets

if TYPE_CHECKING:  # the plan module is imported by the commands that plan (status and history do not)
    from reconciler.plan import Plan

EPILOG = "Settings: each global option is also an environment variable and a config file key (see README)."


def _echo_json(doc) -> None:
    click.echo(json.dumps(doc, indent=2, default=_json_value))


def _json_value(value):
    """Times as ISO-8601 with their zone (SQLite hands back naive UTC datetimes)."""
    if isinstance(value, datetime):
        return (value if value.tzinfo else value.replace(tzinfo=UTC)).isoformat()
    return str(value)


class Context:
    """Lazily built settings and store, shared by the commands of one invocation."""

    def __init__(self, cli_values: dict, config: str | None):
        self.cli_values = cli_values
        self.config = config
        self._settings = None
        self._store = None

    @property
    def settings(self):
        if self._settings is None:
            self._settings = settings_mod.load(self.cli_values, self.config)
        return self._settings

    @property
    def store(self):
        if self._store is None:
            from reconciler.store.schema import is_current
            from reconciler.store.store import Store

            self.settings.state_path.mkdir(parents=True, exist_ok=True)
            self._store = Store(self.settings.db_url)
            if not is_current(self._store.engine):  # alembic only when there is something to upgrade
                self._store.migrate()
        return self._store

    @property
    def read_store(self):
        """The store for a command that only reads: a database that does not exist yet is an
        error (``no database at ...``), never created as a side effect of looking."""
        if self._store is None:
            missing = _missing_sqlite_file(self.settings.db_url)
            if missing is not None:
                raise click.ClickException(
                    f"no database at {missing}: nothing has run with these settings yet "
                    "(check --db / --state-dir, or the config file the daemon uses)")
        return self.store


def _missing_sqlite_file(url: str) -> str | None:
    """The path of a file-based SQLite database that does not exist, else None."""
    from sqlalchemy.engine import make_url

    try:
        parsed = make_url(url)
    except Exception:  # a malformed URL is reported by the store with its own message
        return None
    if not parsed.drivername.startswith("sqlite") or parsed.database in (None, "", ":memory:"):
        return None
    if parsed.database.startswith("file:"):
        return None
    return None if Path(parsed.database).exists() else parsed.database


pass_ctx = click.make_pass_decorator(Context)


def _setting_options(func):
    """One global option per setting, generated from ``settings.Settings`` (declared once)."""
    choices = {"log_format": click.Choice(["text", "json"]),
               "log_level": click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False)}
    for name, env, key, help_text in reversed(settings_mod.describe()):
        flag = "--" + name.replace("_", "-")
        func = click.option(flag, name, type=choices.get(name), metavar=None if name in choices else "VALUE",
                            multiple=name in settings_mod.MULTIPLE,
                            help=f"{help_text[0].upper()}{help_text[1:]} [{env}; config key {key}].")(func)
    return func


class _ScrubbedGroup(click.Group):
    """Every refusal a command prints passes ``secrets.scrub``: a message may quote what a
    client library echoed of a secret this process resolved (a reset's capture, status's lag)."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except click.ClickException as exc:
            exc.message = secrets.scrub(exc.message)
            raise


@click.group(cls=_ScrubbedGroup, epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--config", metavar="FILE", envvar="RECONCILER_CONFIG",
              help="YAML config file [RECONCILER_CONFIG; default /etc/stream-reconciler/config.yaml if present].")
@_setting_options
@click.version_option(package_name="stream-reconciler")
@click.pass_context
def cli(ctx, config, **values):
    """Reconcile stream-ingestion supervisors declared in YAML files.

    \b
    Quick tour:
      reconciler validate specs/          check every spec and marker
      reconciler plan                     what apply would change (exit 2 if anything)
      reconciler apply                    one reconcile pass, no ingestion
      reconciler run                      the daemon: watch, reconcile, ingest
      reconciler status                   state, checkpoints, lag
      reconciler reset clicks --to latest --dry-run

    Example: reconciler --specs examples --state-dir /tmp/state plan
    """
    ctx.obj = Context(values, config)
    try:
        s = ctx.obj.settings
    except ReconcilerError as exc:
        raise click.ClickException(str(exc)) from None
    logs.setup(s.log_level, s.log_format)


def main() -> None:
    try:
        cli(standalone_mode=True)
    except ReconcilerError as exc:  # a command let one through: still a clean message, exit 1
        click.echo(f"Error: {secrets.scrub(str(exc))}", err=True)
        sys.exit(1)


# -- validate ---------------------------------------------------------------------------

@cli.command(epilog="""\b
Examples:
  reconciler validate specs/ examples/kafka-clicks.yaml
  reconciler validate -o json specs/ | jq '.problems[] | "\\(.path):\\(.line): \\(.message)"'
  (a pre-commit hook and a CI job that run it: see "Validating a config repo" in the README)""")
@click.argument("paths", nargs=-1, type=click.Path())
@click.option("-o", "--output", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="json: {ok, specs, markers, problems: [{path, line, column, field, message}]} on stdout.")
@pass_ctx
def validate(c: Context, paths, output):
    """Validate spec and marker files (directories or single files).

    Prints each problem as FILE:LINE:COLUMN: FIELD: MESSAGE and exits 1 if any file is
    invalid. With no PATH, validates the spec directory. Needs no database and no broker,
    so it fits a pre-commit hook or a pull request's CI job.
    """
    from reconciler.errors import SpecInvalid, SpecProblem
    from reconciler.spec import loader

    problems: list[SpecProblem] = []
    specs = markers = 0
    for path in paths or (c.settings.specs,):
        if Path(path).is_dir():
            state = loader.load_directory(path, check_permissions=not c.settings.allow_insecure_specs)
            if not state.ok:
                problems.append(SpecProblem(str(path), None, None, "", str(state.error)))
                continue
            problems += state.problems
            specs += len(state.specs)
            markers += len(state.markers)
            continue
        try:
            if loader.classify(path) == "marker":
                loader.load_marker_file(path)
                markers += 1
            else:
                loader.load_spec_file(path)
                specs += 1
        except SpecInvalid as exc:
            problems += exc.problems
    if output == "json":
        _echo_json({"ok": not problems, "specs": specs, "markers": markers,
                    "problems": [dataclasses.asdict(p) for p in problems]})
        sys.exit(1 if problems else 0)
    for p in problems:
        click.echo(str(p), err=True)
    if problems:
        click.echo(f"{len(problems)} problem(s); {specs} valid spec(s), {markers} valid marker(s)", err=True)
        sys.exit(1)
    click.echo(f"ok: {specs} spec(s), {markers} marker(s) valid")


# -- plan / apply ----------------------------------------------------------------------

def _directory(c: Context):
    from reconciler.spec.loader import load_directory

    return load_directory(c.settings.specs, check_permissions=not c.settings.allow_insecure_specs)


def compute_plan(c: Context, *, confirm: bool = False, with_positions: bool = True, directory=None) -> Plan:
    """Plan, then capture stream positions for the resets it contains and plan again to preview them."""
    from reconciler.plan import ActionKind, PlanSettings, desired_from_directory, plan
    from reconciler.positions import capture

    desired = desired_from_directory(directory or _directory(c))
    actual = c.store.read_actual()
    ps = PlanSettings(max_termination_share=c.settings.max_termination_share, confirm_terminations=confirm)
    first = plan(desired, actual, settings=ps)
    resets = [a for a in first.actions if a.kind in (ActionKind.RESET, ActionKind.RESET_AND_BACKFILL)]
    if not resets or not with_positions:
        return first
    positions, now = {}, datetime.now(UTC)
    for a in resets:
        rec = actual.supervisors.get(a.supervisor_id)
        spec = rec.spec if rec else (a.spec or desired.specs.get(a.supervisor_id, (None, None))[1])
        if spec is None:
            continue
        try:
            positions[a.supervisor_id] = capture(spec, a.request.position, now)[0]
        except ReconcilerError as exc:
            click.echo(f"warning: cannot preview the reset of {a.supervisor_id}: {exc}", err=True)
    return plan(desired, actual, positions=positions, settings=ps)


@cli.command("plan", epilog="Example: reconciler plan -o json | jq '.actions[].kind'")
@click.option("-o", "--output", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--no-positions", is_flag=True, help="Do not ask brokers for offsets to preview resets.")
@pass_ctx
def plan_cmd(c: Context, output, no_positions):
    """Show what `apply` would do: actions with offset ranges and record counts.

    Also lists what apply would NOT do and why: every invalid spec or marker file (as
    FILE:LINE:COLUMN: FIELD: MESSAGE, whether or not the daemon already recorded it) and
    every termination the mass-deletion guard holds. Changes nothing.
    Exit 0 when there is nothing to do (held terminations wait for a confirmation), 2 when
    there are changes, 1 when the spec directory cannot be read or a file is invalid.
    """
    try:
        directory = _directory(c)
        p = compute_plan(c, with_positions=not no_positions, directory=directory)
    except ReconcilerError as exc:
        raise click.ClickException(str(exc)) from None
    errors = ([f"{c.settings.specs}: {directory.error}"] if not directory.ok else []) + \
        [str(problem) for problem in directory.problems]
    doc = {**p.to_dict(), "errors": errors}
    if output == "json":
        click.echo(json.dumps(doc, indent=2))
    else:
        text = render.plan_text(doc)
        if errors and not p.actions:
            text = text.replace("No changes: the database matches the spec directory.",
                                "No changes to apply, but the spec directory has errors:")
        click.echo(text)
        for held in p.held_terminations:
            click.echo(f"held: terminate {held} (confirm with `reconciler apply --confirm-terminations`)")
        for error in errors:
            click.echo(f"error: {error}")
    sys.exit(1 if errors else 2 if p.changes else 0)


@cli.command(epilog="Example: reconciler apply && reconciler status")
@click.option("--confirm-terminations", is_flag=True,
              help="Apply terminations the mass-deletion guard is holding (empty directory, many files gone).")
@click.option("-o", "--output", type=click.Choice(["text", "json"]), default="text", show_default=True)
@pass_ctx
def apply(c: Context, confirm_terminations, output):
    """One reconcile pass: make the database match the spec directory (no ingestion).

    Creates, updates, suspends, resumes and terminates supervisors, and applies reset
    requests (backfill stanzas and marker files). Exit 1 if any action failed.
    """
    from reconciler.apply import Applier

    try:
        p = compute_plan(c, confirm=confirm_terminations, with_positions=False)
        results = Applier(c.store, actor=f"cli:{_user()}", state_dir=c.settings.state_path).apply(p.actions)
    except ReconcilerError as exc:
        raise click.ClickException(str(exc)) from None
    if output == "json":
        _echo_json({"results": [r.to_dict() for r in results], "notes": list(p.notes)})
    else:
        for r in results:
            click.echo(f"{'ok ' if r.ok else 'ERR'} {r.action.kind:<19} {r.action.supervisor_id:<24} {r.message}")
        for n in p.notes:
            click.echo(f"note: {n}")
        if not results:
            click.echo("No changes.")
    sys.exit(0 if all(r.ok for r in results) else 1)


# -- run --------------------------------------------------------------------------------

@cli.command(epilog="Example: reconciler --specs examples run --until-caught-up")
@click.option("--until-caught-up", is_flag=True,
              help="Exit 0 once every running supervisor has ingested up to the latest offsets seen at start "
                   "and every backfill supervisor has completed; exit 1, naming what is not caught up, when "
                   "a supervisor stays UNHEALTHY for 60s, on --timeout, or when stopped by a signal first.")
@click.option("--timeout", type=float, default=None, metavar="SECONDS",
              help="With --until-caught-up: give up (exit 1) after this long.")
@pass_ctx
def run(c: Context, until_caught_up, timeout):
    """Run the daemon: watch the spec directory, reconcile, and ingest.

    Reconciles on every file change (debounced) and every tick; runs one runtime per
    RUNNING supervisor beside the tick loop. SIGTERM finishes or fences in-flight
    batches and exits; a second SIGTERM exits at once (exactly-once still holds).
    """
    from reconciler.daemon import Daemon

    try:
        code = Daemon(c.settings, config_path=c.config, cli_values=c.cli_values).run(
            until_caught_up=until_caught_up, timeout=timeout)
    except ReconcilerError as exc:
        raise click.ClickException(str(exc)) from None
    sys.exit(code)


# -- status / history / segments ----------------------------------------------------------

@cli.command(epilog="Example: reconciler status clicks -o json")
@click.argument("supervisor_id", required=False, metavar="[ID]")
@click.option("-o", "--output", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--no-lag", is_flag=True, help="Do not ask brokers for latest offsets.")
@pass_ctx
def status(c: Context, supervisor_id, output, no_lag):
    """State, detailed state, per-partition checkpoint, latest and lag of supervisors."""
    from reconciler.status import all_status

    try:
        items = all_status(c.read_store, supervisor_id, with_latest=not no_lag)
        lease = c.read_store.lease()
        daemons = c.read_store.daemons()
    except ReconcilerError as exc:
        raise click.ClickException(str(exc)) from None
    if supervisor_id and not items:
        _refuse(f"no supervisor '{supervisor_id}'", output)
    live = bool(lease and lease.live(datetime.now(UTC)))
    for item in items:  # without a leader nothing updates states: they are what was last seen, and when
        item["stale"] = not live
    spark = _spark_status(c.settings)
    if output == "json":
        leader = lease.to_dict() | {"live": live} if lease else None
        _echo_json({"supervisors": items, "leader": leader, "daemons": [d.to_dict() for d in daemons], "spark": spark})
    else:
        click.echo(render.status_text(items, detail=bool(supervisor_id), live=live))
        if lease and live:
            click.echo(f"\nleader: {lease.holder} (token {lease.token}, lease until {lease.expires_at:%H:%M:%S}Z)")
        elif lease:
            click.echo(f"\nleader: none (lease of {lease.holder} expired at {lease.expires_at:%H:%M:%S}Z)")
        for d in daemons:
            click.echo(f"daemon: {d.daemon} {d.role}")
        if spark.get("pid"):  # recorded by a daemon
            click.echo(f"spark: {spark['master']} application {spark['appId'] or '-'} {spark['state']}"
                       + (f" ({spark['reason']})" if spark.get("reason") else ""))


def _spark_status(settings) -> dict | None:
    """What the daemon last recorded of its Spark session (state dir), else the configured master."""
    from reconciler.pipeline.spark import read_status_file

    seen = read_status_file(settings.state_path / "spark.json")
    return seen or {"master": settings.spark_master, "appId": None, "state": "not started", "reason": None}


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
    from reconciler.apply import Applier
    from reconciler.plan import Action, ActionKind
    from reconciler.positions import capture
    from reconciler.requests import from_cli
    from reconciler.resets import compute_reset, fill_from

    position = parse_position(to)
    rec = c.store.get(supervisor_id)
    if rec is None or rec.kind != "main":
        _refuse(f"no main supervisor '{supervisor_id}' (see `reconciler status`)", output)
    req = from_cli(supervisor_id, position, operation_id=uuid.uuid4().hex[:12], backfill=backfill,
                   backfill_task_count=backfill_task_count, allow_rewind=allow_rewind, reason=reason)
    try:
        if dry_run:
            pos, _ = capture(rec.spec, position, datetime.now(UTC))
            current = fill_from(c.store.checkpoints(supervisor_id), pos, rec.spec.start_from)  # the reset transaction's rule
            outcome = compute_reset(position, current, pos, backfill=backfill, allow_rewind=allow_rewind)
            doc = {"dryRun": True, "supervisor": supervisor_id, "position": position.to_document(),
                   "partitions": [p.to_dict() for p in outcome.partitions], "backfillRecords": outcome.backfill_records,
                   "warnings": list(outcome.warnings), "errors": list(outcome.errors)}
            _print_reset(doc, output)
            sys.exit(1 if outcome.errors else 0)
        kind = ActionKind.RESET_AND_BACKFILL if backfill else ActionKind.RESET
        with _quiet("reconciler.apply"):  # its outcome is printed below, once
            [result] = Applier(c.store, actor=f"cli:{req.source}", state_dir=c.settings.state_path).apply(
                [Action(kind, supervisor_id, req.describe(), request=req)])
    except ReconcilerError as exc:
        _refuse(str(exc), output)
    if not result.ok:
        _refuse(result.message, output, supervisor=supervisor_id)
    _print_reset({"dryRun": False, "message": result.message, **result.details}, output)


def _refuse(message: str, output: str, **fields) -> NoReturn:
    """A refusal, printed once: as ``Error: ...`` on stderr, or with ``-o json`` as
    ``{"ok": false, "error": ...}`` on stdout (a script reading JSON gets JSON); exit 1."""
    message = secrets.scrub(message)
    if output == "json":
        _echo_json({"ok": False, "error": message, **fields})
        sys.exit(1)
    raise click.ClickException(message)


@contextlib.contextmanager
def _quiet(logger: str):
    """Hold back a logger's lines while the command itself reports the same outcome."""
    log = logging.getLogger(logger)
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(level)


def _print_reset(doc, output) -> None:
    if output == "json":
        _echo_json(doc)
        return
    if doc.get("message"):
        click.echo(doc["message"])
    click.echo(render.reset_table(doc["partitions"]))
    for w in doc.get("warnings", []) + doc.get("errors", []):
        click.echo(f"! {w}")
    if doc["dryRun"]:
        click.echo(f"dry run: backfill would ingest {doc['backfillRecords']} records; nothing changed")


# -- db ---------------------------------------------------------------------------------

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
    click.echo(f"{supervisor_id}: suspended by operator: {reason}"
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


def _supervisor(c: Context, supervisor_id: str):
    rec = c.store.get(supervisor_id)
    if rec is None:
        raise click.ClickException(f"no supervisor '{supervisor_id}' (see `reconciler status`)")
    return rec


@cli.group("backfill", epilog="Example: reconciler backfill list")
def backfill_group():
    """Operator control of backfill supervisors (bounded, created by resets)."""


@backfill_group.command("list", epilog="Example: reconciler backfill list -o json")
@click.option("-o", "--output", type=click.Choice(["text", "json"]), default="text", show_default=True)
@pass_ctx
def backfill_list(c: Context, output):
    """Every backfill supervisor: its main, state, progress and ETA."""
    from reconciler.status import all_status

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
        try:
            details = c.store.control_backfill(backfill_id, verb, reason, actor=f"cli:{_user()}")
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
    from reconciler.maintaincommands import import_all

    try:  # once: the committed files of the layout before the Iceberg tables, into their tables
        import_all(c)
    except ReconcilerError as exc:
        raise click.ClickException(str(exc)) from None


def _user() -> str:
    from reconciler.requests import _user as user

    return user()


def _register_table_commands() -> None:
    from reconciler import maintaincommands, tablecommands

    tablecommands.register(cli, pass_ctx, _echo_json)
    maintaincommands.register(cli)


_register_table_commands()
