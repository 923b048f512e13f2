"""A spec file named unlike its id (issue 46, a newcomer): `clicks.yaml` holding `id: clickz`
passed `validate` silently and `plan` created `clickz`. Both warn (never fail), naming the
file and line of `id` and the name the file should have."""

from __future__ import annotations

import json

from tests.cli.test_cli import Cli, copy_examples

WARNING = "clicks.yaml:3:1: id: id 'clickz' differs from the file name; by convention the file is clickz.yaml"


def _misnamed(tmp_path):
    specs = copy_examples(tmp_path / "specs", "clicks")
    path = specs / "clicks.yaml"
    lines = path.read_text().splitlines(keepends=True)
    assert lines[2] == "id: clicks\n"  # the line the warning names
    lines[2] = "id: clickz\n"
    path.write_text("".join(lines))
    return Cli(specs, tmp_path / "state", f"sqlite:///{tmp_path / 'state' / 'cli.db'}")


def test_validate_warns_with_the_file_and_line_of_the_id(tmp_path):
    run = _misnamed(tmp_path)
    result = run("validate")
    assert result.exit_code == 0, result.stdout
    assert f"warning: {tmp_path}/specs/{WARNING}" in result.stdout.splitlines()
    doc = json.loads(run("validate", "-o", "json").stdout)
    assert doc["ok"] and doc["problems"] == []
    assert [(w["line"], w["field"], w["message"].split(";")[1].strip()) for w in doc["warnings"]] == [
        (3, "id", "by convention the file is clickz.yaml")]


def test_plan_warns_too(tmp_path):
    run = _misnamed(tmp_path)
    result = run("plan", "--no-positions")
    assert result.exit_code == 2, result.stdout  # changes to make: the warning adds no error
    assert "clickz" in result.stdout and f"warning: {tmp_path}/specs/{WARNING}" in result.stdout.splitlines()
    doc = json.loads(run("plan", "--no-positions", "-o", "json").stdout)
    assert doc["errors"] == [] and doc["warnings"] == [f"{tmp_path}/specs/{WARNING}"]


def test_a_file_named_for_its_id_has_no_warning(tmp_path):
    run = Cli(copy_examples(tmp_path / "specs", "clicks"), tmp_path / "state", None)
    assert "warning" not in run("validate").stdout
    assert "warnings" not in json.loads(run("plan", "--no-positions", "-o", "json").stdout)
