"""Rules that compare files (issue 29; issue 35 item 1): datasources that are another's
dead-letter table or disagree on rollup or column types, and duplicate ids, are refused by
``validate`` of the directory and of the files named together, as by the daemon."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from reconciler import settings as settings_mod
from reconciler.cli import cli
from reconciler.spec.loader import load_directory, load_files

CLEAN_ENV: dict[str, str | None] = {env: None for _, env, _, _ in settings_mod.describe()}
CLEAN_ENV |= {"RECONCILER_CONFIG": None, "STATE_DIRECTORY": None, "CREDENTIALS_DIRECTORY": None}


def spec(sid: str, datasource: str, dims: str = "[user]", metrics: str = "[]", rollup: bool = False) -> str:
    return (f"id: {sid}\nsource: {{type: kafka, bootstrapServers: 'h:9092', topic: {sid}}}\ndataSchema:\n"
            f"  datasource: {datasource}\n  timestamp: {{column: ts}}\n  dimensions: {dims}\n"
            f"  metrics: {metrics}\n  granularity: {{rollup: {str(rollup).lower()}}}\n")


@pytest.fixture
def specs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "specs").mkdir()
    return tmp_path / "specs"


def _messages(state, name: str) -> list[str]:
    return [str(p) for p in state.invalid[f"specs/{name}"].problems]


def test_a_datasource_named_like_another_ones_dead_letter_table(specs):
    (specs / "clicks.yaml").write_text(spec("clicks", "clicks"))
    (specs / "sneaky.yaml").write_text(spec("sneaky", "clicks_deadletter"))
    (specs / "other.yaml").write_text(spec("other", "other_deadletter"))  # no datasource 'other': fine
    state = load_directory("specs")
    assert set(state.by_id()) == {"other"}
    assert _messages(state, "sneaky.yaml") == [
        "specs/sneaky.yaml:4:15: dataSchema.datasource: datasource 'clicks_deadletter' is the dead-letter table "
        "of datasource 'clicks' (specs/clicks.yaml): choose another name"]
    assert _messages(state, "clicks.yaml") == [
        "specs/clicks.yaml:4:15: dataSchema.datasource: the dead letters of datasource 'clicks' go to table "
        "'clicks_deadletter', which specs/sneaky.yaml declares as a datasource: one of them must change"]


@pytest.mark.parametrize("a, b, where, what", [
    (spec("a", "d", dims="[user, bytes]"), spec("b", "d", metrics="[{name: x, type: longSum, field: bytes}]"),
     "dataSchema.dimensions[1]", "column 'bytes' is string here but long in specs/b.yaml"),
    (spec("a", "d", dims="[user]"), spec("b", "d", dims="[User]"),
     "dataSchema.dimensions[0]", "column 'user' is spelled 'User' in specs/b.yaml"),
    (spec("a", "d", metrics="[{name: n, type: count}]", rollup=True), spec("b", "d"),
     "dataSchema.granularity.rollup", "datasource 'd' is also written by specs/b.yaml with rollup: false"),
])
def test_supervisors_of_one_datasource_must_agree(specs, a, b, where, what):
    (specs / "a.yaml").write_text(a)
    (specs / "b.yaml").write_text(b)
    state = load_directory("specs")
    assert not state.specs
    problems = state.invalid["specs/a.yaml"].problems
    assert any(p.field == where and p.message.startswith(what) and p.line for p in problems), problems
    assert state.invalid["specs/b.yaml"].problems, "both files are refused, as for duplicate ids"


def test_supervisors_of_one_datasource_that_agree_are_fine(specs):
    (specs / "a.yaml").write_text(spec("a", "d", dims="[user, page]"))
    (specs / "b.yaml").write_text(spec("b", "d", dims="[user]", metrics="[{name: x, type: longSum, field: n}]"))
    assert set(load_directory("specs").by_id()) == {"a", "b"}


def test_files_named_together_are_checked_together_per_directory(specs, tmp_path):
    (specs / "clicks.yaml").write_text(spec("clicks", "clicks"))
    (specs / "copy.yaml").write_text(spec("clicks", "clicks2"))  # the same id
    (specs / "views.yaml").write_text(spec("views", "views"))
    (specs / "sneaky.yaml").write_text(spec("sneaky", "views_deadletter"))
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "clicks.yaml").write_text(spec("clicks", "x"))  # another directory: never met
    states = load_files(["specs/clicks.yaml", "specs/copy.yaml", "specs/views.yaml", "specs/sneaky.yaml",
                         "elsewhere/clicks.yaml"])
    problems = [str(p) for s in states for p in s.problems]
    assert any("specs/copy.yaml:1:1: id: id 'clicks' is also declared in specs/clicks.yaml" in p for p in problems)
    assert any("'views_deadletter' is the dead-letter table" in p for p in problems)
    assert not any(p.startswith("elsewhere/") for p in problems)
    runner = CliRunner()
    together = runner.invoke(cli, ["validate", "specs/clicks.yaml", "specs/copy.yaml"], env=CLEAN_ENV)
    assert together.exit_code == 1 and "is also declared in specs/clicks.yaml" in together.stdout
    # named alone (a hook names the changed file only) it is judged beside the directory's
    # other specs, as the daemon judges it: it was accepted, and the daemon refused it
    alone = runner.invoke(cli, ["validate", "specs/copy.yaml"], env=CLEAN_ENV)
    assert alone.exit_code == 1 and "is also declared in specs/clicks.yaml" in alone.stdout, alone.output
    assert "specs/clicks.yaml:" not in alone.stdout  # the sibling is not reported
