"""Where the binary formats' writer schemas come from, and the Confluent wire format.

* ``RegistrySource``: a Confluent-compatible schema registry (``schemaRegistry: {url,
  basicAuth: {username, password}}``), read through confluent-kafka's own
  ``SchemaRegistryClient``. Each id is fetched once per process and kept (a registered
  schema never changes under its id; an id the registry did not know is asked again by
  the next task). A registry that does not answer, or
  answers 5xx, raises ``RegistryUnavailable``: the batch fails and is retried, its records
  wait. A 404 for an id is an answer: those records are dead letters ("unknown schema id").
* ``FileSource``: one schema from a file in the config repo (``schemaFile`` /
  ``descriptorFile``, relative to the spec's directory); values are plain bodies.
* ``split_wire``: magic byte and schema id of every value, in bulk.

The password is a secret reference resolved here (``spec.secrets.resolve``, granted ones
only) and never appears in a message: the URL is shown without its user info.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from reconciler.errors import RetryableError
from reconciler.pipeline.formats import FormatUnavailable
from reconciler.spec import secrets

NO_MAGIC = "no magic byte: not in the Confluent wire format (byte 0 must be 0)"
SHORT_HEADER = "truncated header: fewer than 5 bytes (magic byte and schema id)"


class RegistryUnavailable(FormatUnavailable, RetryableError):
    """The schema registry did not answer: records wait (never dead letters for this)."""


class UnknownSchema(LookupError):
    """The registry answered that it has no such id: that id's records are dead letters."""


@dataclass(frozen=True)
class WriterSchema:
    """One writer schema: its id (0 for a schema file), type and text (Avro JSON, a
    ``.proto`` file's text, or a descriptor set's bytes), and the schemas it references
    (name -> text, ``.proto`` imports)."""

    id: int
    kind: str  # AVRO | PROTOBUF
    text: str | bytes
    references: Mapping[str, str] = field(default_factory=dict)


# Shared by every source of this process (a Spark worker runs many tasks): an id names one
# schema for the life of its registry, so a schema fetched once serves every later task.
_FETCHED: dict[tuple[str, int], WriterSchema] = {}


class RegistrySource:
    wire = True

    def __init__(self, url: str, username: str | None = None, password: str | None = None,
                 *, retries: int = 1):
        self._conf: dict[str, Any] = {"url": url, "max.retries": retries, "retries.wait.ms": 200,
                                      "timeout": 10}
        if username is not None:
            self._conf["basic.auth.user.info"] = f"{username}:{password or ''}"
        self.url = secrets.redact_uri(url)
        self._client: Any = None  # made on the first id not yet fetched: a client loads its TLS roots (30 ms a task)
        self._unknown: set[int] = set()

    def get(self, schema_id: int) -> WriterSchema:
        """The writer schema of an id (cached); ``UnknownSchema`` on the registry's 404."""
        if (self.url, schema_id) in _FETCHED:
            return _FETCHED[(self.url, schema_id)]
        if schema_id in self._unknown:
            raise UnknownSchema(schema_id)
        from confluent_kafka.schema_registry import SchemaRegistryClient
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        if self._client is None:
            self._client = SchemaRegistryClient(self._conf)
        try:
            schema = self._client.get_schema(schema_id)
            refs = {r.name: self._client.get_version(r.subject, r.version).schema.schema_str
                    for r in (schema.references or [])}
        except SchemaRegistryError as e:
            if e.http_status_code == 404:
                self._unknown.add(schema_id)
                raise UnknownSchema(schema_id) from None
            raise RegistryUnavailable(
                f"schema registry {self.url} answered {e.http_status_code} for schema id "
                f"{schema_id} ({e.error_message}): the batch waits and is retried") from None
        except Exception as e:  # httpx's transport errors: refused, reset, timeout, DNS
            raise RegistryUnavailable(
                f"schema registry {self.url} is unreachable ({type(e).__name__}: {e}): "
                f"the batch waits and is retried") from None
        out = WriterSchema(schema_id, (schema.schema_type or "AVRO").upper(), schema.schema_str, refs)
        _FETCHED[(self.url, schema_id)] = out
        return out


class FileSource:
    wire = False

    def __init__(self, path: Path, kind: str, data: bytes | None = None):
        self.path = path
        data = path.read_bytes() if data is None else data
        self.schema = WriterSchema(0, kind, data if kind == "PROTOBUF" else data.decode("utf-8"))

    def get(self, schema_id: int) -> WriterSchema:
        return self.schema


def source_from(options: Mapping[str, Any], base_dir: str | None, kind: str,
                file_key: str, files: Mapping[str, bytes] | None = None) -> RegistrySource | FileSource:
    """The source a format block names (``schemaRegistry`` or a schema file: its bytes from
    ``files`` when the driver sent them, else read under ``base_dir``)."""
    if options.get("schemaRegistry"):
        reg = options["schemaRegistry"]
        auth = reg.get("basicAuth") or {}
        password = secrets.resolve(auth["password"]) if auth.get("password") is not None else None
        return RegistrySource(str(reg["url"]), auth.get("username"), password)
    if options.get(file_key):
        name = str(options[file_key])
        return FileSource(Path(base_dir or ".") / name, kind, (files or {}).get(name))
    raise ValueError(f"{kind.lower()}: needs schemaRegistry or {file_key}")


def split_wire(values: pa.Array) -> tuple[np.ndarray, pa.Array, pa.Array | None]:
    """(schema id per value (-1 where none), the bodies after the 5-byte header, reasons or
    None). A null value has id -1 and no reason."""
    values = values.cast(pa.binary())
    n = len(values)
    lengths = pc.fill_null(pc.binary_length(values), 0).to_numpy(zero_copy_only=False)
    head = pc.binary_slice(values, 0, 5)
    padded = pc.binary_join_element_wise(head, pa.scalar(b"\xff" * 5, pa.binary()), b"")
    fixed = pc.binary_slice(pc.fill_null(padded, b"\xff" * 5), 0, 5).cast(pa.binary(5))
    raw = np.frombuffer(fixed.buffers()[1], np.uint8, count=5 * n,
                        offset=5 * fixed.offset).reshape(n, 5)
    ids = raw[:, 1:].copy().view(">u4").reshape(n).astype(np.int64)
    valid = values.is_valid().to_numpy(zero_copy_only=False)
    magic_ok = raw[:, 0] == 0
    ok = valid & magic_ok & (lengths >= 5)
    ids[~ok] = -1
    reasons = None
    bad = valid & ~ok
    if bad.any():
        text = np.where(magic_ok | (lengths == 0), SHORT_HEADER, NO_MAGIC)
        text = np.where((lengths > 0) & ~magic_ok, NO_MAGIC, text)
        reasons = pa.array(np.where(bad, text, None), pa.string())
    return ids, pc.binary_slice(values, 5, 2**31 - 1), reasons
