"""Value formats: a batch of record values (bytes) -> Arrow columns plus dead letters.

One module per format, each a complete implementation of ``Format`` (the shape of
confluent-kafka's serdes, per batch), chosen once per task by ``format_for``: the
transform never asks which format it runs.

The interface (for every format module)::

    class XFormat(Format):
        name = "x"                                    # the spec's dataSchema.format
        def __init__(self, data_schema, base_dir=None, files=None)
        # base_dir: the spec's directory; files: the schema files it names, read by the
        # driver (``schema_files``): a task in a remote executor has no config repo
        def decode(self, values, fields) -> Decoded

* ``values``: a binary ``pa.Array``, one value per record. A null value (a tombstone)
  gives null columns and no reason: the transform dead-letters it as "null value".
* ``fields``: the ``Field``s the data schema reads (timestamp column, dimensions, metric
  fields): ``name`` (the output column), ``path`` (the field's dotted path in the record,
  ``("geo", "country")``) and ``type`` (``FIELD_TYPES``, or ``None``: the format's own type).
* ``Decoded.columns[name]``: one array per field, ``len(values)`` long, null where the
  record has no such field. Either of:
  - ``pa.string()`` holding the value's text by the JSON rules (``jsonparse.render``):
    the text formats (json, csv). The transform converts text to the field's type with
    ``times.to_long``/``to_double``/``parse_times`` (one rule per value, whatever the batch);
  - the value's own Arrow type (int32, float32, timestamp, struct, list, ...): the binary
    formats (avro, protobuf). The transform casts it to the field's type (Arrow's safe
    casts; ``json`` is the value's compact JSON text).
  A value that does not fit its field's type is a dead letter the transform writes
  (``qty: "abc" is not a long``): formats never judge types.
* ``Decoded.dead``: a string array of reasons (null for a good record), or ``None`` when
  every record decoded. A reason names the problem (and the field, where there is one):
  "invalid JSON: not a JSON object", "no magic byte", "unknown schema id 7", "truncated
  body". Such a record's columns are null.
* ``Decoded.discovered``: with ``schemaDiscovery``, the top-level fields of this batch
  (name -> Arrow type, in first-seen order); their columns are in ``columns`` too, under
  their names. ``None`` without discovery.
* A format that cannot decode now but will later (a schema registry that is down) raises
  ``FormatUnavailable``: the batch fails and is retried; records never become dead
  letters for that.

``format_for(data_schema, base_dir, files)`` imports the module of ``data_schema.format`` from
``FORMATS`` (``reconciler.pipeline.formats.<format>``, class ``<Name>Format``).
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pyarrow as pa

from reconciler.model import DataSchema

# The types a field may be read as; None in a Field: the format's own.
FIELD_TYPES = ("string", "long", "double", "boolean", "timestamp", "json")
ARROW_TYPES: Mapping[str, pa.DataType] = {
    "string": pa.string(),
    "long": pa.int64(),
    "double": pa.float64(),
    "boolean": pa.bool_(),
    "timestamp": pa.timestamp("us", tz="UTC"),
    "json": pa.string(),
}
assert set(ARROW_TYPES) == set(FIELD_TYPES)

FORMATS: Mapping[str, str] = {
    "json": "JsonFormat",
    "csv": "CsvFormat",
    "avro": "AvroFormat",
    "protobuf": "ProtobufFormat",
}


@dataclass(frozen=True)
class Field:
    """One field the data schema reads."""

    name: str
    path: tuple[str, ...]
    type: str | None = None

    @property
    def top(self) -> str:
        return self.path[0]


@dataclass(frozen=True)
class Decoded:
    columns: dict[str, pa.Array]
    dead: pa.Array | None = None
    discovered: dict[str, pa.DataType] | None = None


class FormatUnavailable(Exception):
    """The format cannot decode now (its schema registry is down): retry the batch later."""


class Format(ABC):
    name: ClassVar[str]

    def __init__(self, data_schema: DataSchema, base_dir: str | None = None,
                 files: Mapping[str, bytes] | None = None):
        self.data_schema = data_schema
        self.base_dir = base_dir
        self.files = dict(files or {})

    @abstractmethod
    def decode(self, values: pa.Array, fields: Sequence[Field]) -> Decoded:
        """The fields of every value (see the module's docstring)."""


# The format blocks' keys that name a file, relative to the spec's directory.
FILE_KEYS: Mapping[str, str] = {"avro": "schemaFile", "protobuf": "descriptorFile"}


def schema_files(data_schema: DataSchema, base_dir: str | None) -> dict[str, bytes]:
    """The file a data schema's format block names (its name as written -> its bytes),
    read where the spec lives (the driver): what the tasks get instead of a path."""
    key = FILE_KEYS.get(data_schema.format)
    options = dict(getattr(data_schema, "format_options", None) or {})
    options = options.get(data_schema.format, options)
    name = options.get(key) if key else None
    if not isinstance(name, str) or options.get("schemaRegistry"):
        return {}
    path = Path(base_dir or ".") / name
    try:
        return {name: path.read_bytes()}
    except OSError as e:
        raise ValueError(f"{data_schema.format}.{key} {name!r} cannot be read "
                         f"(looked for {str(path.absolute())!r}): {e.strerror or e}") from None


def format_for(data_schema: DataSchema, base_dir: str | None = None,
               files: Mapping[str, bytes] | None = None) -> Format:
    """The one ``Format`` of a data schema (chosen once per task)."""
    name = data_schema.format
    if name not in FORMATS:
        raise ValueError(f"unknown format {name!r}: one of {', '.join(FORMATS)}")
    module = importlib.import_module(f"{__name__}.{name}")
    cls: type[Format] = getattr(module, FORMATS[name])
    return cls(data_schema, base_dir, files)
