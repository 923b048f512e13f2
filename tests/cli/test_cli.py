"""The command line, through click's CliRunner and through the real ``reconciler`` script.

Spec directories are copies of ``examples/*.yaml`` under ``tmp_path``. Tests that touch
the metadata database take ``db_url`` and so run on SQLite and on PostgreSQL.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result

from reconciler import settings as settings_mod
from reconciler.cli import cli

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
SCRIPT = Path(sys.executable).parent / "reconciler"  # the [project.scripts] entry point
TYPO = "source.topc: unknown key (did you mean 'topic'?)"

# Every variable settings read, cleared so the host's environment cannot leak in.
CLEAN_ENV: dict[str, str | None] = {env: None for _, env, _, _ in settings_mod.describe()}
CLEAN_ENV |= {"RECONCILER_CONFIG": None, "STATE_DIRECTORY": None}


@pytest.fixture(autouse=True)
def isolated(monkeypatch, tmp_path) -> Iterator[None]:
    """No host config file; the root logger's handlers restored after each test."""
    monkeypatch.setattr(settings_mod, "DEFAULT_CONFIG", tmp_path / "no-such-config.yaml")
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def copy_examples(directory: Path, *names: str) -> Path:
    """Copy examples into ``directory`` as ``<id>.yaml``; default: the two Kafka examples."""
    directory.mkdir(parents=True, exist_ok=True)
    for sid in names or ("clicks", "clicks-rollup"):
        shutil.copy(EXAMPLES / f"{sid}.yaml", directory / f"{sid}.yaml")
    return directory


def misspell(path: Path) -> int:
    """Turn ``topic:`` into ``topc:``; returns the 1-based line of the typo."""
    lines = path.read_text().splitlines(keepends=True)
    [index] = [i for i, line in enumerate(lines) if line.strip().startswith("topic:")]
    lines[index] = lines[index].replace("topic:", "topc:")
    path.write_text("".join(lines))
    return index + 1


class Cli:
    """``reconciler --specs S --state-dir T --db URL ...`` through CliRunner."""

    def __init__(self, specs: Path, state: Path, db: str | None):
        self.specs, self.state, self.db = specs, state, db
        self.runner = CliRunner()

    def __call__(self, *args: str, env: dict[str, str] | None = None, globals_: bool = True) -> Result:
        head = ["--specs", str(self.specs), "--state-dir", str(self.state)] if globals_ else []
        if globals_ and self.db:
            head += ["--db", self.db]
        return self.runner.invoke(cli, [*head, *args], env=CLEAN_ENV | (env or {}), catch_exceptions=False)

    def json(self, *args: str, code: int = 0) -> dict | list:
        result = self(*args)
        assert result.exit_code == code, (result.stdout, result.stderr)
        return json.loads(result.stdout)


@pytest.fixture
def specs(tmp_path) -> Path:
    return copy_examples(tmp_path / "specs")


@pytest.fixture
def run(tmp_path, specs, db_url) -> Cli:
    return Cli(specs, tmp_path / "state", db_url)


@pytest.fixture
def run_sqlite(tmp_path, specs) -> Cli:
    """For tests that need a database but are about the command line, not the database."""
    return Cli(specs, tmp_path / "state", f"sqlite:///{tmp_path / 'state' / 'cli.db'}")


def kinds(doc: dict) -> list[tuple[str, str]]:
    return [(a["kind"], a["supervisor"]) for a in doc["actions"]]


def status_of(run: Cli, sid: str) -> dict:
    doc = run.json("status", "-o", "json", "--no-lag")
    [item] = [s for s in doc["supervisors"] if s["id"] == sid]
    return item


# --------------------------------------------------------------------------- validate


def test_validate_examples_exits_0():
    result = CliRunner().invoke(cli, ["validate", str(EXAMPLES)], env=CLEAN_ENV)
    assert result.exit_code == 0, result.output
    n = len([p for p in EXAMPLES.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file()])
    assert n >= 3
    assert result.stdout.strip().splitlines()[-1] == f"ok: {n} spec(s), 0 marker(s) valid"  # after the note on secrets


def test_validate_example_markers():
    markers = sorted((EXAMPLES / "markers").rglob("*.reset.yaml"))
    assert len(markers) >= 5
    result = CliRunner().invoke(cli, ["validate", *map(str, markers)], env=CLEAN_ENV)
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == f"ok: 0 spec(s), {len(markers)} marker(s) valid"


def test_validate_misspelled_key_exits_1_with_file_line_field_and_suggestion(tmp_path, specs):
    line = misspell(specs / "clicks.yaml")
    result = CliRunner().invoke(cli, ["validate", str(specs)], env=CLEAN_ENV)
    assert result.exit_code == 1
    path = specs / "clicks.yaml"
    assert f"{path}:{line}:3: {TYPO}" in result.stdout.splitlines()  # the report: `validate > report.txt`
    assert "1 problem(s); 1 valid spec(s), 0 valid marker(s)" in result.stdout
    assert result.stderr == ""


def test_validate_single_file(specs):
    line = misspell(specs / "clicks-rollup.yaml")
    ok = CliRunner().invoke(cli, ["validate", str(specs / "clicks.yaml")], env=CLEAN_ENV)
    bad = CliRunner().invoke(cli, ["validate", str(specs / "clicks-rollup.yaml")], env=CLEAN_ENV)
    assert (ok.exit_code, ok.stdout.strip()) == (0, "ok: 1 spec(s), 0 marker(s) valid")
    assert bad.exit_code == 1
    assert f"{specs / 'clicks-rollup.yaml'}:{line}:3: {TYPO}" in bad.stdout


def test_validate_defaults_to_the_spec_directory(tmp_path, specs):
    result = Cli(specs, tmp_path / "state", None)("validate")
    assert result.exit_code == 0
    assert result.stdout.strip() == "ok: 2 spec(s), 0 marker(s) valid"


def test_validate_missing_directory(tmp_path):
    result = CliRunner().invoke(cli, ["validate", str(tmp_path / "nope")], env=CLEAN_ENV)
    assert result.exit_code == 1
    assert f"{tmp_path / 'nope'}: cannot read: No such file or directory" in result.stdout


# --------------------------------------------------------------------------- plan and apply


def test_plan_json_then_apply_then_plan_exits_0(run: Cli):
    doc = run.json("plan", "-o", "json", code=2)
    assert kinds(doc) == [("create", "clicks"), ("create", "clicks-rollup")]
    assert [n.split(" yet: ")[1] for n in doc["notes"]] == [  # plan created no database
        "planned against an empty one (the daemon or `reconciler apply` creates it)"]
    assert doc["heldTerminations"] == []
    assert doc["actions"][0]["path"] == str(run.specs / "clicks.yaml")
    assert len(doc["actions"][0]["specHash"]) == 16

    applied = run("apply")
    assert applied.exit_code == 0, applied.output
    assert "create" in applied.stdout and "clicks-rollup" in applied.stdout

    assert run.json("plan", "-o", "json") == {"actions": [], "notes": [], "heldTerminations": [], "errors": []}
    text = run("plan")
    assert (text.exit_code, text.stdout.strip()) == (0, "No changes: the database matches the spec directory.")
    again = run("apply")
    assert (again.exit_code, again.stdout.strip()) == (0, "No changes.")

    status = run.json("status", "-o", "json", "--no-lag")
    assert [(s["id"], s["kind"], s["state"]) for s in status["supervisors"]] == [
        ("clicks", "main", "PENDING"), ("clicks-rollup", "main", "PENDING")]
    assert status["supervisors"][0]["lag"] is None  # not asked: never a false 0


def test_apply_json_output(run: Cli):
    doc = run.json("apply", "-o", "json")
    assert [(r["action"]["kind"], r["ok"]) for r in doc["results"]] == [("create", True), ("create", True)]
    assert doc["results"][0]["message"] == "created; PENDING until a runtime starts it"


def test_deleting_one_of_two_specs_plans_terminate(run: Cli):
    assert run("apply").exit_code == 0
    (run.specs / "clicks-rollup.yaml").unlink()
    doc = run.json("plan", "-o", "json", code=2)
    assert kinds(doc) == [("terminate", "clicks-rollup")]
    assert doc["actions"][0]["reason"] == "spec file removed"
    assert run("apply").exit_code == 0
    gone = status_of(run, "clicks-rollup")
    assert (gone["state"], gone["epoch"]) == ("TERMINATED", 2)
    assert run.json("plan", "-o", "json", code=0)["actions"] == []


def test_corrupting_a_spec_keeps_its_last_valid_spec(run: Cli):
    assert run("apply").exit_code == 0
    before = status_of(run, "clicks")
    line = misspell(run.specs / "clicks.yaml")
    error = f"{run.specs / 'clicks.yaml'}:{line}:3: {TYPO}"

    doc = run.json("plan", "-o", "json", code=1)  # an invalid file is an error of the plan
    assert kinds(doc) == [("mark-invalid", "clicks")]
    assert doc["actions"][0]["error"] == error
    assert doc["errors"] == [error]
    assert run("apply").exit_code == 0

    after = status_of(run, "clicks")
    assert after["specHash"] == before["specHash"]
    assert after["lastError"] == error
    assert (after["state"], after["epoch"]) == (before["state"], before["epoch"])
    assert after["source"]["topic"] == "clicks"
    # marked once; the plan still names the invalid file (the daemon's record is no "no changes")
    assert run.json("plan", "-o", "json", code=1) == {"actions": [], "notes": [], "heldTerminations": [],
                                                      "errors": [error]}

    misspell_fixed = (run.specs / "clicks.yaml").read_text().replace("topc:", "topic:")
    (run.specs / "clicks.yaml").write_text(misspell_fixed)
    doc = run.json("plan", "-o", "json", code=2)
    assert [(a["kind"], a["reason"]) for a in doc["actions"]] == [("update", "spec file is valid again")]
    assert run("apply").exit_code == 0
    assert status_of(run, "clicks")["lastError"] is None


def test_empty_directory_holds_terminations(run: Cli):
    assert run("apply").exit_code == 0
    for f in run.specs.iterdir():
        f.unlink()
    doc = run.json("plan", "-o", "json", code=0)
    assert doc["actions"] == []
    assert doc["heldTerminations"] == ["clicks", "clicks-rollup"]
    assert "spec directory is empty" in doc["notes"][0]
    held = run("apply")
    assert held.exit_code == 0 and "note: spec directory is empty" in held.stdout
    assert status_of(run, "clicks")["state"] == "PENDING"
    confirmed = run.json("apply", "--confirm-terminations", "-o", "json")
    assert [(r["action"]["kind"], r["action"]["supervisor"]) for r in confirmed["results"]] == [
        ("terminate", "clicks"), ("terminate", "clicks-rollup")]
    assert status_of(run, "clicks")["state"] == "TERMINATED"


def test_suspend_and_resume(run: Cli):
    assert run("apply").exit_code == 0
    path = run.specs / "clicks.yaml"
    path.write_text(path.read_text().replace("suspended: false", "suspended: true"))
    assert kinds(run.json("plan", "-o", "json", code=2)) == [("update", "clicks"), ("suspend", "clicks")]
    assert run("apply").exit_code == 0
    assert status_of(run, "clicks")["state"] == "SUSPENDED"
    path.write_text(path.read_text().replace("suspended: true", "suspended: false"))
    assert kinds(run.json("plan", "-o", "json", code=2)) == [("update", "clicks"), ("resume", "clicks")]
    assert run("apply").exit_code == 0
    assert status_of(run, "clicks")["state"] == "PENDING"


def test_history_lists_create_and_update(run: Cli):
    assert run("apply").exit_code == 0
    path = run.specs / "clicks.yaml"
    path.write_text(path.read_text().replace("taskCount: 2", "taskCount: 3"))
    assert run("apply").exit_code == 0
    entries = run.json("history", "clicks", "-o", "json")
    assert [e["action"] for e in entries] == ["create", "update"]
    assert all(e["actor"].startswith("cli:") for e in entries)
    assert entries[1]["details"]["specHash"] == status_of(run, "clicks")["specHash"]
    text = run("history", "clicks")
    assert text.exit_code == 0
    lines = text.stdout.strip().splitlines()
    assert len(lines) == 2 and " create " in lines[0] and " update " in lines[1]
    missing = run("history", "nope")
    assert missing.exit_code == 1 and "no supervisor 'nope'" in missing.stderr


def test_status_of_unknown_supervisor(run: Cli):
    assert run("apply").exit_code == 0  # the database exists
    result = run("status", "nope", "--no-lag")
    assert result.exit_code == 1
    assert "no supervisor 'nope'" in result.stderr


def test_segments_of_an_empty_datasource(run: Cli):
    assert run("apply").exit_code == 0
    assert run.json("segments", "clicks", "-o", "json") == []


@pytest.mark.parametrize("command", [
    ("status",), ("status", "clicks"), ("history", "clicks"), ("segments", "clicks"),
    ("verify", "clicks"), ("compact", "clicks", "--dry-run"), ("maintain", "--dry-run"), ("backfill", "list"),
    # a dry run, and the commands that act on a supervisor, need one: none of them may leave an
    # empty database behind that `status` would then read as "no supervisors" (issue 46)
    ("reset", "clicks", "--to", "latest", "--dry-run"), ("reset", "clicks", "--to", "latest"),
    ("suspend", "clicks", "--reason", "x"), ("resume", "clicks", "--reason", "x"),
    ("backfill", "cancel", "clicks-backfill-1", "--reason", "x")])
def test_read_only_commands_and_dry_runs_never_create_a_database(tmp_path, specs, command):
    db = tmp_path / "absent" / "dir" / "x.db"
    state = tmp_path / "state"
    result = Cli(specs, state, f"sqlite:///{db}")(*command)
    assert result.exit_code == 1, result.stdout + result.stderr
    assert f"no database at {db}" in result.stderr
    assert not db.exists() and not db.parent.exists()
    assert not state.exists()  # nor the state directory, nor segments under it


def test_a_dry_run_reset_without_a_database_answers_json_with_json(tmp_path, specs):
    db = tmp_path / "x.db"
    result = Cli(specs, tmp_path / "state", f"sqlite:///{db}")(
        "reset", "clicks", "--to", "latest", "--dry-run", "-o", "json")
    assert result.exit_code == 1
    doc = json.loads(result.stdout)
    assert doc["ok"] is False and doc["error"].startswith(f"no database at {db}")
    assert not db.exists()


def _tables(db_url: str) -> list[str]:
    import sqlalchemy as sa

    from reconciler.store.engine import create_engine

    engine = create_engine(db_url)
    try:
        return sorted(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_plan_without_a_database_plans_against_an_empty_one_and_creates_nothing(tmp_path, specs):
    state = tmp_path / "absent" / "state"
    run = Cli(specs, state, None)
    result = run("plan")
    assert result.exit_code == 2, result.stderr  # the examples would be created
    assert f"note: no database at {state / 'reconciler.db'} yet: planned against an empty one" in result.stdout
    assert [line.split()[:2] for line in result.stdout.splitlines()[:2]] == [
        ["create", "clicks"], ["create", "clicks-rollup"]]
    assert not state.exists()  # neither the database nor its directory
    doc = run.json("plan", "-o", "json", code=2)
    assert [n for n in doc["notes"] if n.startswith("no database at")]
    assert not state.exists()


def test_plan_of_a_database_without_tables_creates_none(run: Cli):
    """On PostgreSQL the database exists before anything ran: plan leaves it empty."""
    url = run.db
    if not url.startswith("postgresql"):
        from sqlalchemy.engine import make_url

        path = Path(make_url(url).database)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()  # an empty file is a SQLite database without tables
    assert run.json("plan", "-o", "json", code=2)["actions"]
    assert _tables(url) == []


def test_an_older_schema_is_neither_migrated_nor_read_by_plan_and_status(run: Cli):
    from alembic import command
    from alembic.config import Config

    from reconciler.store.schema import head_revision
    from reconciler.store.store import MIGRATIONS, Store

    store = Store(run.db)
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    with store.engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "0001")
    store.close()
    for command_line in (("plan",), ("status",), ("history", "clicks")):
        result = run(*command_line)
        assert result.exit_code == 1, (command_line, result.stdout)
        assert f"has schema revision 0001, and this version of reconciler reads {head_revision()}: upgrade it " \
               "with `reconciler db upgrade`" in result.stderr, result.stderr
    assert "overrides" not in _tables(run.db)  # 0002's table: nothing migrated
    assert run("db", "upgrade").exit_code == 0
    assert run("plan").exit_code == 2


def test_reset_dry_run_of_unknown_supervisor(run: Cli):
    assert run("apply").exit_code == 0  # the database exists (without one: "no database at")
    result = run("reset", "nope", "--to", "latest", "--dry-run")
    assert result.exit_code == 1
    assert "Error: no main supervisor 'nope' (see `reconciler status`)" in result.stderr


def test_reset_rejects_a_bad_position(run_sqlite: Cli):
    result = run_sqlite("reset", "clicks", "--to", "sometime", "--dry-run")
    assert result.exit_code == 2  # a usage error, before any database or broker
    assert "Error: Invalid value for '--to': not a timestamp: 'sometime'" in result.stderr
    assert "or use latest, earliest, or offsets JSON" in result.stderr


def test_db_upgrade_prints_the_revision(run: Cli):
    first, second = run("db", "upgrade"), run("db", "upgrade")
    assert (first.exit_code, first.stdout.strip()) == (0, "database at revision 0006")
    assert (second.exit_code, second.stdout.strip()) == (0, "database at revision 0006")


def test_default_database_is_sqlite_in_the_state_dir(tmp_path, specs):
    run = Cli(specs, tmp_path / "state", None)
    assert run("apply").exit_code == 0
    assert (tmp_path / "state" / "reconciler.db").is_file()


# --------------------------------------------------------------------------- settings


def test_environment_variables(tmp_path, specs):
    db = tmp_path / "env.db"
    run = Cli(specs, tmp_path / "state", None)
    env = {"RECONCILER_SPECS": str(specs), "RECONCILER_DB": f"sqlite:///{db}",
           "RECONCILER_STATE_DIR": str(tmp_path / "state")}
    result = run("plan", "-o", "json", "--no-positions", env=env, globals_=False)
    assert result.exit_code == 2, result.output
    doc = json.loads(result.stdout)
    assert kinds(doc) == [("create", "clicks"), ("create", "clicks-rollup")]
    assert doc["notes"][0].startswith(f"no database at {db} yet")  # the one the variable names, not created
    assert not db.exists()


def test_config_file(tmp_path, specs):
    db = tmp_path / "file.db"
    config = tmp_path / "config.yaml"
    config.write_text(f"specs: {specs}\ndb: sqlite:///{db}\nstateDir: {tmp_path / 'state'}\n")
    run = Cli(specs, tmp_path / "state", None)
    result = run("--config", str(config), "apply", globals_=False)
    assert result.exit_code == 0, result.output
    assert db.is_file()
    env_result = run("plan", env={"RECONCILER_CONFIG": str(config)}, globals_=False)
    assert env_result.exit_code == 0  # the same database, through RECONCILER_CONFIG


def test_cli_beats_env_beats_file(tmp_path):
    dirs = {sid: copy_examples(tmp_path / f"specs-{sid}", sid) for sid in ("clicks", "clicks-rollup", "orders")}
    config = tmp_path / "config.yaml"
    config.write_text(f"specs: {dirs['clicks']}\ndb: sqlite:///{tmp_path / 'file.db'}\n"
                      f"stateDir: {tmp_path / 'state'}\n")
    env = {"RECONCILER_CONFIG": str(config)}
    run = Cli(tmp_path, tmp_path / "state", None)

    def planned(*args: str, extra_env: dict[str, str] | None = None) -> tuple[list[str], str]:
        """The supervisors planned, and the database file plan names (it creates none)."""
        result = run(*args, "plan", "-o", "json", env=env | (extra_env or {}), globals_=False)
        assert result.exit_code == 2, result.output
        doc = json.loads(result.stdout)
        db = Path(doc["notes"][0].removeprefix("no database at ").split(" yet:")[0])
        return [a["supervisor"] for a in doc["actions"]], db.name

    assert planned() == (["clicks"], "file.db")
    assert planned(extra_env={"RECONCILER_SPECS": str(dirs["clicks-rollup"]),
                              "RECONCILER_DB": f"sqlite:///{tmp_path / 'env.db'}"}) == (["clicks-rollup"], "env.db")
    assert planned("--specs", str(dirs["orders"]), "--db", f"sqlite:///{tmp_path / 'cli.db'}",
                   "--secret-env", "RMQ_PASSWORD",  # the example's ${env:RMQ_PASSWORD}, granted
                   extra_env={"RECONCILER_SPECS": str(dirs["clicks-rollup"]), "RMQ_PASSWORD": "guest",
                              "RECONCILER_DB": f"sqlite:///{tmp_path / 'env.db'}"}) == (["orders"], "cli.db")
    assert list(tmp_path.glob("*.db")) == []


def test_bad_config_file_is_a_clear_error(tmp_path, specs):
    config = tmp_path / "config.yaml"
    config.write_text("specz: x\n")
    result = Cli(specs, tmp_path / "state", None)("--config", str(config), "validate", globals_=False)
    assert result.exit_code == 2  # a configuration error
    assert f"config file {config}: unknown setting(s) specz" in result.stderr


# --------------------------------------------------------------------------- help


def _commands(group: click.Group, prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    for name, cmd in sorted(group.commands.items()):
        yield (*prefix, name)
        if isinstance(cmd, click.Group):
            yield from _commands(cmd, (*prefix, name))


ALL_COMMANDS = list(_commands(cli))


def test_every_command_is_listed():
    expected = {("apply",), ("db",), ("db", "upgrade"), ("history",), ("plan",), ("reset",), ("run",),
                ("segments",), ("status",), ("validate",), ("suspend",), ("resume",), ("backfill",),
                ("backfill", "list"), ("backfill", "suspend"), ("backfill", "resume"), ("backfill", "cancel"),
                ("verify",), ("compact",), ("maintain",), ("deadletter",), ("deadletter", "list"),
                ("deadletter", "replay")}
    assert set(ALL_COMMANDS) == expected
    docs = "\n".join(p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])
    for path in ALL_COMMANDS:
        if path not in (("db",), ("backfill",), ("deadletter",)):
            shown = f"reconciler {' '.join(path)}"
            assert shown in docs, f"README.md and docs/ do not show `{shown}`"


@pytest.mark.parametrize("path", ALL_COMMANDS, ids=[" ".join(p) for p in ALL_COMMANDS])
def test_help_has_an_example(path):
    result = CliRunner().invoke(cli, [*path, "--help"], env=CLEAN_ENV)
    assert result.exit_code == 0
    assert result.stdout.startswith(f"Usage: cli {' '.join(path)} ") or result.stdout.startswith(
        f"Usage: reconciler {' '.join(path)} ")
    assert "Example" in result.stdout
    assert "reconciler " in result.stdout.split("Example", 1)[1]


def test_top_level_help():
    result = CliRunner().invoke(cli, ["--help"], env=CLEAN_ENV)
    assert result.exit_code == 0
    for option, env in [("--specs", "RECONCILER_SPECS"), ("--db", "RECONCILER_DB"),
                        ("--state-dir", "RECONCILER_STATE_DIR"), ("--segments", "RECONCILER_SEGMENTS"),
                        ("--spark-master", "RECONCILER_SPARK_MASTER"), ("--config", "RECONCILER_CONFIG")]:
        assert option in result.stdout and env in result.stdout
    assert "reconciler plan" in result.stdout  # the quick tour's examples


# --------------------------------------------------------------------------- the real script


def script(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in CLEAN_ENV}
    return subprocess.run([str(SCRIPT), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_console_script_is_installed():
    assert SCRIPT.is_file(), f"{SCRIPT} missing: pip install -e . into the virtualenv"
    from importlib.metadata import version

    result = script("--version", cwd=ROOT)
    assert result.returncode == 0
    assert result.stdout.strip() == f"reconciler, version {version('stream-reconciler')}"  # from the git tag


def test_script_validate(tmp_path, specs):
    assert script("validate", str(EXAMPLES), cwd=tmp_path).returncode == 0
    line = misspell(specs / "clicks.yaml")
    result = script("validate", "specs", cwd=tmp_path)  # a relative path is shown as given
    assert result.returncode == 1
    assert f"specs/clicks.yaml:{line}:3: {TYPO}" in result.stdout.splitlines()


def test_script_plan_apply_plan(tmp_path, specs, db_url):
    common = ["--specs", str(specs), "--state-dir", str(tmp_path / "state"), "--db", db_url]
    first = script(*common, "plan", "-o", "json", cwd=tmp_path)
    assert first.returncode == 2, first.stderr
    assert [a["kind"] for a in json.loads(first.stdout)["actions"]] == ["create", "create"]
    assert script(*common, "apply", cwd=tmp_path).returncode == 0
    second = script(*common, "plan", "-o", "json", cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    assert json.loads(second.stdout)["actions"] == []
    upgrade = script(*common, "db", "upgrade", cwd=tmp_path)
    assert (upgrade.returncode, upgrade.stdout.strip()) == (0, "database at revision 0006")


def test_bad_log_level_from_the_environment_is_a_clear_error(tmp_path, specs):
    result = Cli(specs, tmp_path / "state", None)("validate", env={"RECONCILER_LOG_LEVEL": "verbose"})
    assert result.exit_code == 2  # a configuration error
    assert "Error: logLevel must be DEBUG, INFO, WARNING or ERROR, not 'verbose'" in result.stderr


def test_status_says_when_the_specs_sit_one_level_down(tmp_path):
    """Issue 46: a config repo cloned whole into the watched directory gave zero supervisors,
    silently. status (and plan) name the folder to point --specs at."""
    repo = tmp_path / "repo"
    copy_examples(repo / "specs")
    run = Cli(repo, tmp_path / "state", f"sqlite:///{tmp_path / 'x.db'}")
    applied = run("apply")
    assert applied.exit_code == 0 and "No changes." in applied.stdout
    assert f"its subdirectories hold some: {repo / 'specs'}" in applied.stdout
    status = run("status", "--no-lag")
    assert status.exit_code == 0
    assert status.stdout.startswith(f"note: no spec at the top level of {repo}") and "--specs" in status.stdout
    assert "note:" not in Cli(repo / "specs", tmp_path / "state", run.db)("status", "--no-lag").stdout


def test_maintain_defaults_are_the_daemons_and_a_huge_duration_is_refused(run_sqlite: Cli):
    """Issue 46: maintain's "safe defaults" (7 days, 100 snapshots) differed from the daemon's
    (snapshotRetention 1h, snapshotsKept 25), unexplained. They are the daemon's settings now."""
    text = " ".join(run_sqlite("maintain", "--help").stdout.split())
    assert "the daemon's snapshotRetention" in text and "the daemon's snapshotsKept" in text
    assert "7d" not in text.split("Examples:")[0].split("--older-than")[1][:200]
    assert run_sqlite("apply").exit_code == 0
    r = run_sqlite("maintain", "--dry-run", "--older-than", "100000000h")
    assert r.exit_code == 2 and "too long: at most 87600h" in r.stderr and "Traceback" not in r.stderr


def test_validate_of_a_folder_whose_specs_sit_one_level_down_fails_naming_the_folder(tmp_path):
    """The newcomer's run (issue 46): `validate repo` said `ok: 0 spec(s)` and exited 0, so a CI
    job pointed at a config repo's root passed having checked nothing."""
    repo = tmp_path / "repo"
    copy_examples(repo / "specs")
    run = Cli(repo, tmp_path / "state", f"sqlite:///{tmp_path / 'x.db'}")
    result = run("validate", str(repo))
    assert result.exit_code == 1
    assert f"its subdirectories hold some: {repo / 'specs'}" in result.stdout
    assert run("validate", str(repo / "specs")).exit_code == 0
