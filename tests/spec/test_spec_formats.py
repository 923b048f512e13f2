"""The spec's formats and typed dimensions (issue 42): schema, blocks, schema files, and
column types agreeing across the specs of one datasource."""

from __future__ import annotations

import json

import pytest

from reconciler.spec.loader import load_directory
from tests.spec.test_crossfile import spec


def head(sid: str, extra: str, dims: str = "[user]") -> str:
    return (f"id: {sid}\nsource: {{type: kafka, bootstrapServers: 'h:9092', topic: {sid}}}\ndataSchema:\n"
            f"  datasource: {sid}\n  timestamp: {{column: ts, format: millis}}\n  dimensions: {dims}\n{extra}")


@pytest.fixture
def specs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "specs").mkdir()
    return tmp_path / "specs"


def problems(specs, name: str, text: str) -> list[str]:
    (specs / f"{name}.yaml").write_text(text)
    state = load_directory("specs")
    entry = state.invalid.get(f"specs/{name}.yaml")
    return [str(p) for p in entry.problems] if entry else []


def test_the_issue_example_is_valid(specs):
    (specs / "schemas").mkdir()
    (specs / "schemas" / "orders.avsc").write_text(json.dumps({
        "type": "record", "name": "Order", "fields": [
            {"name": "ts", "type": "long"}, {"name": "user", "type": "string"}, {"name": "price", "type": "double"},
            {"name": "geo", "type": ["null", {"type": "record", "name": "Geo",
                                              "fields": [{"name": "country", "type": "string"}]}]}]}))
    dims = "[user, {name: price, type: double}, {name: country, path: geo.country}]"
    text = head("orders", "  format: avro\n  avro: {schemaFile: schemas/orders.avsc}\n  schemaDiscovery: true\n", dims)
    assert problems(specs, "orders", text) == []
    assert problems(specs, "reg", head("reg", "  format: avro\n  avro: {schemaRegistry: {url: 'http://r:8081', "
                                       "basicAuth: {username: u, password: p}}}\n")) == []
    csv = "  format: csv\n  csv: {columns: [id, ts, user, price], delimiter: ',', skipHeader: false}\n"
    assert problems(specs, "c", head("c", csv, "[user, {name: price, type: double}]")) == []


@pytest.mark.parametrize("extra, dims, expected", [
    ("  format: json\n  csv: {columns: [ts, user]}\n", "[user]",
     "specs/x.yaml:8:8: dataSchema.csv: csv: is given but format is 'json'"),
    ("  format: csv\n", "[user]", "specs/x.yaml:7:11: dataSchema.format: format csv needs a dataSchema.csv block"),
    ("  format: csv\n  csv: {columns: [ts, id]}\n", "[user]",
     "specs/x.yaml:6:16: dataSchema.dimensions[0]: 'user' is not one of the CSV columns ['ts', 'id']"),
    ("  format: avro\n  avro: {schemaFile: ../orders.avsc}\n", "[user]",
     "specs/x.yaml:8:22: dataSchema.avro.schemaFile: '../orders.avsc' lies outside the spec's directory"),
    ("  format: avro\n  avro: {schemaFile: nope.avsc}\n", "[user]",
     "specs/x.yaml:8:22: dataSchema.avro.schemaFile: 'nope.avsc' does not exist"),
    ("", "[{name: qty, type: integer}]", "specs/x.yaml:6:34: dataSchema.dimensions[0].type:"),
])
def test_format_mistakes_name_file_line_and_field(specs, extra, dims, expected):
    found = problems(specs, "x", head("x", extra, dims))
    assert any(p.startswith(expected) for p in found), found


def test_an_avro_schema_file_must_parse_and_hold_the_fields_read(specs):
    (specs / "bad.avsc").write_text('{"type": "recrd", "name": "X"}')
    found = problems(specs, "x", head("x", "  format: avro\n  avro: {schemaFile: bad.avsc}\n"))
    assert any("dataSchema.avro.schemaFile: 'bad.avsc' does not parse" in p for p in found), found
    (specs / "ok.avsc").write_text(json.dumps({"type": "record", "name": "X", "fields": [
        {"name": "ts", "type": "long"}, {"name": "geo", "type": {"type": "record", "name": "G", "fields": []}}]}))
    found = problems(specs, "x", head("x", "  format: avro\n  avro: {schemaFile: ok.avsc}\n",
                                      "[{name: c, path: geo.country}]"))
    assert any("dataSchema.dimensions[0]: 'geo.country': geo has no field 'country'" in p for p in found), found


def test_typed_columns_must_agree_across_the_specs_of_a_datasource(specs):
    (specs / "a.yaml").write_text(spec("a", "d", dims="[user, {name: qty, type: long}]"))
    (specs / "b.yaml").write_text(spec("b", "d", dims="[user, {name: qty, type: double}]"))
    state = load_directory("specs")
    assert not state.specs
    found = [str(p) for p in state.invalid["specs/a.yaml"].problems]
    assert any("dataSchema.dimensions[1]: column 'qty' is long here but double in specs/b.yaml" in p
               for p in found), found


def test_schema_discovery_with_rollup_is_refused_naming_file_line_and_field(specs):
    """Rollup groups by the declared dimensions: discovered fields were silently dropped."""
    rollup = ("  schemaDiscovery: true\n  metrics: [{name: n, type: count}]\n"
              "  granularity: {segment: hour, query: none, rollup: true}\n")
    found = problems(specs, "x", head("x", rollup))
    assert any(p.startswith("specs/x.yaml:7:20: dataSchema.schemaDiscovery: schemaDiscovery cannot be combined "
                            "with granularity.rollup: true") for p in found), found
    assert problems(specs, "y", head("y", rollup.replace("rollup: true", "rollup: false"))) == []


def test_a_file_named_alone_is_judged_with_the_other_specs_of_its_directory(specs):
    """A pre-commit hook names the changed file only: its qty double was accepted while the
    daemon, reading the whole directory, refuses it beside b.yaml's long."""
    from reconciler.spec.loader import load_files

    (specs / "a.yaml").write_text(spec("a", "d", dims="[user, {name: qty, type: double}]"))
    (specs / "b.yaml").write_text(spec("b", "d", dims="[user, {name: qty, type: long}]"))
    (specs / "c.yaml").write_text(spec("c", "other", dims="[user, {name: qty, type: long}]"))
    [state] = load_files(["specs/a.yaml"])
    assert not state.specs and list(state.invalid) == ["specs/a.yaml"]  # b.yaml judged with it, not reported
    found = [str(p) for p in state.invalid["specs/a.yaml"].problems]
    assert any("column 'qty' is double here but long in specs/b.yaml" in p for p in found), found
    [state] = load_files(["specs/c.yaml"])
    assert list(state.specs) == ["specs/c.yaml"] and not state.invalid
