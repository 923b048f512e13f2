"""The ``catalog`` setting: parsed from the config file, RECONCILER_CATALOG or --catalog (JSON),
checked at start with errors that name the setting, never echoing a property's value."""

from __future__ import annotations

import json

import pytest

from reconciler import settings
from reconciler.errors import PermanentError


def _load(tmp_path, *, cli=None, env=None, file=None):
    config = None
    if file is not None:
        config = tmp_path / "config.yaml"
        config.write_text(file, encoding="utf-8")
    return settings.load(cli or {}, config=str(config) if config else None, env=env or {})


def test_default_is_the_metadata_database(tmp_path):
    assert _load(tmp_path).catalog == {}


def test_config_file_map(tmp_path):
    s = _load(tmp_path, file="catalog:\n  type: glue\n  namespace: lake\n  properties:\n"
                             "    glue.region: eu-west-1\n    glue.secret-access-key: '${env:GLUE_SECRET}'\n")
    assert s.catalog == {"type": "glue", "namespace": "lake",
                         "properties": {"glue.region": "eu-west-1", "glue.secret-access-key": "${env:GLUE_SECRET}"}}


@pytest.mark.parametrize("source", ["env", "cli"])
def test_json_from_environment_and_command_line(tmp_path, source):
    value = json.dumps({"type": "rest", "properties": {"uri": "http://127.0.0.1:8181"}})
    s = _load(tmp_path, env={"RECONCILER_CATALOG": value} if source == "env" else {},
              cli={"catalog": value} if source == "cli" else {},
              file="catalog: {type: glue}\n")
    assert s.catalog == {"type": "rest", "namespace": "default", "properties": {"uri": "http://127.0.0.1:8181"}}


@pytest.mark.parametrize(("value", "words"), [
    ({"type": "hive"}, "type 'hive' is not one of sql, glue, rest"),
    ({"type": "rest"}, "type rest needs properties.uri"),
    ({"type": "glue", "region": "x"}, "unknown key(s) region"),
    ({"type": "glue", "properties": {"py-catalog-impl": "evil.Catalog"}}, "py-catalog-impl is not allowed"),
    ({"type": "sql", "properties": {"uri": "x"}}, "type sql is the metadata database's own catalog"),
    ({"type": "glue", "namespace": "a b"}, "is not a name"),
])
def test_refusals_name_the_setting(tmp_path, value, words):
    with pytest.raises(PermanentError) as err:
        _load(tmp_path, env={"RECONCILER_CATALOG": json.dumps(value)})
    assert "catalog" in str(err.value) and words in str(err.value)


def test_malformed_json_is_not_echoed(tmp_path):
    with pytest.raises(PermanentError) as err:
        _load(tmp_path, cli={"catalog": '{"type": "glue", "properties": {"glue.secret": "hunter2"'})
    assert "setting catalog (--catalog): not JSON" in str(err.value) and "hunter2" not in str(err.value)


def test_a_nested_value_is_refused_without_its_text(tmp_path):
    with pytest.raises(PermanentError) as err:
        _load(tmp_path, file="catalog:\n  type: glue\n  properties:\n    glue.token: [hunter2]\n")
    assert "must be a single value" in str(err.value) and "hunter2" not in str(err.value)


def test_catalog_needs_a_restart():
    from reconciler.daemon import RESTART_FIELDS

    assert "catalog" in RESTART_FIELDS
