"""Replay parses as a batch of the same spec would (issue 42): with schemaDiscovery a
discovered column keeps the table's type (the dead letters alone would decide another),
and a format's schema file is read from the spec's directory."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pyarrow as pa
import pytest

from reconciler.model import DataSchema
from reconciler.pipeline.transform import DEAD_SCHEMA
from reconciler.store.engine import create_engine
from reconciler.table import catalog as cat
from reconciler.table.deadletters import DeadFile
from reconciler.table.replay import _parse
from reconciler.table.replayspecs import ReplayRefused, how_to_parse

T0 = 1_764_000_000_000


def _spec(**kw):
    return SimpleNamespace(data_schema=DataSchema(datasource="clicks", dimensions=("id",), timestamp_column="ts",
                                                  timestamp_format="millis", **kw))


def _letters(values: list[dict]) -> DeadFile:
    rows = pa.table({"partition": ["0"] * len(values), "offset": pa.array(range(len(values)), pa.int64()),
                     "key": pa.array([b"k"] * len(values), pa.binary()),
                     "value": pa.array([json.dumps(v).encode() for v in values], pa.binary()),
                     "reason": ["missing timestamp column 'ts'"] * len(values)}).cast(DEAD_SCHEMA)
    return DeadFile(task=None, supervisor="clicks", rows=rows)


def test_a_discovered_column_replays_in_the_tables_type(tmp_path):
    tables = cat.Tables(create_engine(f"sqlite:///{tmp_path}/db.sqlite"), str(tmp_path / "segments"))
    tables.ensure("clicks", pa.schema([("__time", pa.timestamp("us", tz="UTC")), ("id", pa.string()),
                                       ("n", pa.float64()), ("tag", pa.string())]), "hour")
    spec = _spec(schema_discovery=True)
    how = how_to_parse(tables, {"clicks": SimpleNamespace(spec_path=None)}, "clicks", {"clicks": spec})
    parsed = _parse(_letters([{"id": "a", "ts": T0, "n": 3, "tag": 7}]), spec, None, how["clicks"])
    # alone, the letters decide n long and tag long: an append the double and string columns refuse
    assert parsed.rows.schema.field("n").type == pa.float64() and parsed.rows.schema.field("tag").type == pa.string()
    assert parsed.rows.to_pylist()[0]["n"] == 3.0 and parsed.rows.to_pylist()[0]["tag"] == "7"


def test_a_schema_file_is_read_from_the_specs_directory_or_the_replay_is_refused_naming_it(tmp_path):
    tables = cat.Tables(create_engine(f"sqlite:///{tmp_path}/db.sqlite"), str(tmp_path / "segments"))
    specs = tmp_path / "specs"
    (specs / "schemas").mkdir(parents=True)
    (specs / "schemas" / "o.avsc").write_text(json.dumps({"type": "record", "name": "O", "fields": [
        {"name": "id", "type": "string"}, {"name": "ts", "type": "long"}]}))
    spec = _spec(format="avro", format_options={"avro": {"schemaFile": "schemas/o.avsc"}})
    actual = {"clicks": SimpleNamespace(spec_path=str(specs / "clicks.yaml"))}
    how = how_to_parse(tables, actual, "clicks", {"clicks": spec})
    assert list(how["clicks"]["files"]) == ["schemas/o.avsc"]
    (specs / "schemas" / "o.avsc").unlink()
    with pytest.raises(ReplayRefused, match=r"supervisor clicks: avro.schemaFile 'schemas/o.avsc' cannot be read"):
        how_to_parse(tables, actual, "clicks", {"clicks": spec})
