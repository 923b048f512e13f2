"""``validate``, ``plan`` and ``apply``: the spec directory against the database."""

from __future__ import annotations

import dataclasses
import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import click

from reconciler.cli.base import Context, _echo_json, _user, cli, pass_ctx
from reconciler.errors import ReconcilerError
from reconciler.observe import render

if TYPE_CHECKING:  # the plan module is imported by the commands that plan (status and history do not)
    from reconciler.control.actual import ActualState
    from reconciler.control.plan import Plan


@cli.command(epilog="""\b
Examples:
  reconciler validate specs/ examples/clicks.yaml
  reconciler validate -o json specs/ | jq '.problems[] | "\\(.path):\\(.line): \\(.message)"'
  (a pre-commit hook and a CI job that run it: see "Validating a config repo" in the README)""")
@click.argument("paths", nargs=-1, type=click.Path())
@click.option("-o", "--output", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="json: {ok, specs, markers, problems: [{path, line, column, field, message}]} on stdout.")
@pass_ctx
def validate(c: Context, paths, output):
    """Validate spec and marker files (directories or single files).

    Prints each problem as FILE:LINE:COLUMN: FIELD: MESSAGE on stdout (the report: `validate
    > report.txt` keeps it) and exits 1 if any file is invalid. With no PATH, validates the
    spec directory. Files named together are checked together, per directory, as the daemon
    would (duplicate ids, datasources that collide). Secret references are checked against
    the daemon's grants (secretsDir, secretEnv, secretGrants) whenever its settings are
    here, read as `plan` reads them (--config, RECONCILER_CONFIG, else
    /etc/stream-reconciler/config.yaml when it exists; environment; flags); with no settings
    at all (a CI job), for syntax only, said in one line. Needs no database and no broker, so
    it fits a pre-commit hook or a pull request's CI job; where the database is there, each
    spec's columns are also checked against its table (a change it cannot take).
    """
    from reconciler.errors import SpecProblem
    from reconciler.spec import loader
    from reconciler.spec.grants import Grants

    granted = Grants.from_settings(c.settings)
    # As plan checks them whenever the daemon's settings are here: a config file that grants
    # nothing grants nothing (the daemon refuses every reference), not "syntax only".
    grants = granted if granted.given or _config_file(c) is not None else None
    problems: list[SpecProblem] = []
    specs = markers = 0
    paths = paths or (c.settings.specs,)
    states = []
    for path in paths:
        if not Path(path).is_dir():
            continue
        state = loader.load_directory(path, check_permissions=not c.settings.allow_insecure_specs, grants=grants)
        if not state.ok:
            problems.append(SpecProblem(str(path), None, None, "", str(state.error)))
            continue
        if state.hint:  # specs one level down: a CI job must not pass having checked nothing
            problems.append(SpecProblem(str(path), None, None, "", state.hint))
        states.append(state)
    states += loader.load_files([p for p in paths if not Path(p).is_dir()], grants=grants)
    for state in states:
        problems += state.problems
        specs += len(state.specs)
        markers += len(state.markers)
    problems += _table_problems(c, states)
    note = None if grants else ("note: secret references were checked for syntax only: no daemon settings here "
                                "(no config file, secretsDir, secretEnv or secretGrants); give the daemon's "
                                "(--config FILE) to check them as the daemon and `plan` do")
    warnings = [w for state in states for w in state.warnings]  # advice: the exit status stays 0
    if output == "json":
        _echo_json({"ok": not problems, "specs": specs, "markers": markers, "secretsChecked": grants is not None,
                    "problems": [dataclasses.asdict(p) for p in problems],
                    "warnings": [dataclasses.asdict(w) for w in warnings]})
        sys.exit(1 if problems else 0)
    # The problems are the command's output, as the json report is: stdout. stderr is left to
    # what stops it from running at all (a setting, an unreadable config file).
    for p in problems:
        click.echo(render.printable(str(p)))
    for w in warnings:
        click.echo(f"warning: {render.printable(str(w))}")
    if note and _has_references(states):
        click.echo(note)
    if problems:
        click.echo(f"{len(problems)} problem(s); {specs} valid spec(s), {markers} valid marker(s)")
        sys.exit(1)
    click.echo(f"ok: {specs} spec(s), {markers} marker(s) valid")


def _config_file(c: Context) -> Path | None:
    """The config file these settings were read from, as ``settings.load`` finds it, or None."""
    from reconciler import settings as settings_mod

    if c.config:
        return Path(c.config)
    return settings_mod.DEFAULT_CONFIG if settings_mod.DEFAULT_CONFIG.exists() else None


def _table_problems(c: Context, states) -> list:
    """Each spec whose columns its table cannot take (``table.types.table_problems``), when
    the database is there; without one, or out of reach, nothing (validate needs none)."""
    try:
        store = c.existing_store()
    except click.ClickException:
        return []
    if store is None:
        return []
    from reconciler.table.catalogs import open_tables
    from reconciler.table.types import table_problems

    out = []
    try:
        tables = open_tables(store.engine, c.settings.warehouse, c.settings.catalog)  # the lake's too
        for state in states:
            for path, spec in sorted(state.specs.items()):
                out += table_problems(tables, str(path), spec)  # at the refused column's line
    except Exception as exc:  # noqa: BLE001 - a warehouse out of reach: the other checks stand
        click.echo(f"note: the tables could not be checked ({type(exc).__name__}: {exc})", err=True)
    return out


def _has_references(states) -> bool:
    from reconciler.spec.secrets import has_reference

    def walk(doc) -> bool:
        if isinstance(doc, dict):
            return any(walk(v) for v in doc.values())
        if isinstance(doc, list):
            return any(walk(v) for v in doc)
        return has_reference(doc)

    return any(walk(spec.document.get("source")) for state in states for spec in state.specs.values())


# -- plan / apply ----------------------------------------------------------------------

def _directory(c: Context):
    """The spec directory as the daemon reads it: against the operator's grants, always."""
    from reconciler.spec.grants import Grants
    from reconciler.spec.loader import load_directory

    return load_directory(c.settings.specs, check_permissions=not c.settings.allow_insecure_specs,
                          grants=Grants.from_settings(c.settings))


def compute_plan(c: Context, *, confirm: bool = False, with_positions: bool = True, directory=None,
                 actual: ActualState | None = None, lag=None) -> Plan:
    """Plan, then capture stream positions for the resets it contains and plan again to preview
    them. Against ``actual`` (and the observed ``lag`` of the lag policies) when given, else what
    the database holds (created and migrated first: apply writes anyway)."""
    from reconciler.control.plan import ActionKind, PlanSettings, desired_from_directory, plan
    from reconciler.control.positions import capture
    from reconciler.runtime import startedover

    desired = desired_from_directory(directory or _directory(c))
    if actual is None:
        actual = c.creating_store.read_actual()
        lag = c.creating_store.lag_states()
    now = datetime.now(UTC)  # lag policies act on what the daemon observed (``lag``), measured against now
    ps = PlanSettings(max_termination_share=c.settings.max_termination_share, confirm_terminations=confirm)
    first = plan(desired, actual, settings=ps, now=now, lag=lag)
    resets = [a for a in first.actions if a.kind in (ActionKind.RESET, ActionKind.RESET_AND_BACKFILL)]
    if not resets or not with_positions:
        return first
    positions = {}
    for a in resets:
        rec = actual.supervisors.get(a.supervisor_id)
        spec = rec.spec if rec else (a.spec or desired.specs.get(a.supervisor_id, (None, None))[1])
        if spec is None:
            continue
        try:
            pos = capture(spec, a.request.position, now)[0]
            if rec is not None:  # the preview says what the reset will do on a source that started over
                why = startedover.started_over(c.existing_store(), rec, a.request.position)
                pos = dataclasses.replace(pos, started_over=why)
            positions[a.supervisor_id] = pos
        except ReconcilerError as exc:
            click.echo(f"warning: cannot preview the reset of {a.supervisor_id}: {render.printable(exc)}", err=True)
    return plan(desired, actual, positions=positions, settings=ps, now=now, lag=lag)


@cli.command("plan", epilog="Example: reconciler plan -o json | jq '.actions[].kind'")
@click.option("-o", "--output", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--no-positions", is_flag=True, help="Do not ask brokers for offsets to preview resets.")
@pass_ctx
def plan_cmd(c: Context, output, no_positions):
    """Show what `apply` would do: actions with offset ranges and record counts.

    Also lists what apply would NOT do and why: every invalid spec or marker file (as
    FILE:LINE:COLUMN: FIELD: MESSAGE, whether or not the daemon already recorded it) and
    every termination the mass-deletion guard holds. Changes nothing: it writes nothing, not
    even a database where none exists yet (it plans against an empty one and says so), and
    refuses a database of another schema version.
    Exit 0 when there is nothing to do (held terminations wait for a confirmation), 2 when
    there are changes, 1 when the spec directory cannot be read or a file is invalid.
    """
    from reconciler.control.actual import ActualState

    notes = []
    try:
        directory = _directory(c)
        store = c.existing_store()
        if store is None:
            notes.append(f"no database at {c.database_shown()} yet: planned against an empty one "
                         "(the daemon or `reconciler apply` creates it)")
        actual = store.read_actual() if store is not None else ActualState()
        lag = store.lag_states() if store is not None else {}
        p = compute_plan(c, with_positions=not no_positions, directory=directory, actual=actual, lag=lag)
    except ReconcilerError as exc:
        raise click.ClickException(str(exc)) from None
    errors = ([f"{c.settings.specs}: {directory.error}"] if not directory.ok else []) + \
        [str(problem) for problem in directory.problems]
    schema_lines, refusals = _schema_preview(c, directory) if store is not None else ([], [])
    errors += refusals
    doc = {**p.to_dict(), "errors": errors}
    if directory.warnings:  # advice (a file named unlike its id): the exit status stays as planned
        doc["warnings"] = [str(w) for w in directory.warnings]
    if schema_lines:
        doc["schemaChanges"] = schema_lines
    doc["notes"] += notes
    if output == "json":
        click.echo(json.dumps(doc, indent=2))
    else:
        if directory.hint:  # first, not among the notes: "No changes" above it read as all is well
            click.echo(f"note: {render.printable(directory.hint)}")
        text = render.plan_text(doc | {"notes": [n for n in doc["notes"] if n != directory.hint]})
        if errors and not p.actions:
            text = text.replace("No changes: the database matches the spec directory.",
                                "No changes to apply, but the spec directory has errors:")
        elif directory.hint and not p.actions:
            text = text.replace("No changes: the database matches the spec directory.",
                                "No changes planned: the spec directory holds no spec at its top level.")
        click.echo(text)
        for held in p.held_terminations:
            click.echo(f"held: terminate {held} (confirm with `reconciler apply --confirm-terminations`)")
        for line in schema_lines:
            click.echo(f"schema: {render.printable(line)}")
        for error in errors:
            click.echo(f"error: {render.printable(error)}")
        for warning in doc.get("warnings", []):
            click.echo(f"warning: {render.printable(warning)}")
    sys.exit(1 if errors else 2 if p.changes or schema_lines else 0)


def _schema_preview(c: Context, directory) -> tuple[list[str], list[str]]:
    """(each valid spec's change to its table: ``orders: + column coupon string (optional)``,
    the changes its table cannot take as errors). A dry run: the tables are only read."""
    from reconciler.cli.tables import open_tables
    from reconciler.pipeline.transform import output_schemas
    from reconciler.table.types import changes

    tables = open_tables(c)
    lines, refusals = [], []
    for path, spec in sorted(directory.specs.items()):
        ds = spec.data_schema
        table = tables.load(ds.datasource)
        if table is None:
            continue
        for change in changes(table.schema(), output_schemas(ds)[0]):
            text = f"{ds.datasource}: {change}"
            (refusals if change.kind == "refuse" else lines).append(f"{path}: {text}" if change.kind == "refuse" else text)
    return list(dict.fromkeys(lines)), refusals


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
    from reconciler.control.apply import Applier
    from reconciler.runtime import startedover

    try:
        p = compute_plan(c, confirm=confirm_terminations, with_positions=False)
        results = Applier(c.creating_store, actor=f"cli:{_user()}", state_dir=c.settings.state_path,
                          warehouse=c.settings.warehouse, catalog=c.settings.catalog,
                          started_over=startedover.asker(c.creating_store)).apply(p.actions)
    except ReconcilerError as exc:
        raise click.ClickException(str(exc)) from None
    if output == "json":
        _echo_json({"results": [r.to_dict() for r in results], "notes": list(p.notes)})
    else:
        for r in results:
            click.echo(f"{'ok ' if r.ok else 'ERR'} {r.action.kind:<19} {render.printable(r.action.supervisor_id):<24} "
                       f"{render.printable(r.message)}")
        for n in p.notes:
            click.echo(f"note: {render.printable(n)}")
        if not results:
            click.echo("No changes.")
    sys.exit(0 if all(r.ok for r in results) else 1)
