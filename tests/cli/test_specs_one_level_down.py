"""Specs one level down (issue 46, the third newcomer): with a config repo cloned whole into the
watched directory, `status` opened with "No supervisors. Add a spec to the spec directory and run
`reconciler apply`" and `plan` with "No changes: the database matches the spec directory.", the
note that names the folder to point --specs at coming last. Both lead with that note now."""

from __future__ import annotations

import json

from tests.cli.test_cli import Cli, copy_examples


def _repo(tmp_path) -> Cli:
    repo = tmp_path / "repo"
    copy_examples(repo / "specs")
    return Cli(repo, tmp_path / "state", f"sqlite:///{tmp_path / 'x.db'}")


def test_status_leads_with_the_note_not_the_advice_to_add_a_spec(tmp_path):
    run = _repo(tmp_path)
    assert run("apply").exit_code == 0
    result = run("status", "--no-lag")
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"note: no spec at the top level of {run.specs}, which is the only level read")
    assert f"{run.specs / 'specs'} (2 YAML files)" in lines[0] and "--specs" in lines[0]
    assert "Add a spec" not in result.stdout
    assert result.stdout.count("no spec at the top level") == 1


def test_status_with_supervisors_still_leads_with_the_note_then_shows_them(tmp_path):
    """Supervisors applied from the right folder, then the daemon's --specs pointed at the repo's
    root: the note comes first, and the supervisors as last seen stay below it."""
    run = _repo(tmp_path)
    assert Cli(run.specs / "specs", run.state, run.db)("apply").exit_code == 0
    result = run("status", "--no-lag")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith(f"note: no spec at the top level of {run.specs}")
    assert "clicks-rollup" in result.stdout


def test_plan_leads_with_the_note_and_does_not_say_the_database_matches(tmp_path):
    run = _repo(tmp_path)
    result = run("plan")
    assert result.exit_code == 0, result.stderr  # nothing is wrong with the database
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"note: no spec at the top level of {run.specs}, which is the only level read")
    assert lines[1] == "No changes planned: the spec directory holds no spec at its top level."
    assert "the database matches" not in result.stdout
    assert result.stdout.count("no spec at the top level") == 1
    doc = json.loads(run("plan", "-o", "json").stdout)
    assert doc["actions"] == [] and any("no spec at the top level" in n for n in doc["notes"])
