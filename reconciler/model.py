"""The lowest floor: typed, frozen value types shared by every layer (specs, positions,
markers, partition ranges) and the parsers of their units (durations, sizes, file names).

Built from a document that already passed JSON Schema validation, so the
constructors here only translate names and apply defaults; they do not re-check.
Secret references (``${env:...}``, ``${file:...}``) are kept verbatim: they are
resolved only when a client is built (see ``reconciler.spec.secrets``).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

VIRTUAL_COLUMNS = ("__key", "__partition", "__offset", "__stream_time")
# The tables' partition column, the time chunk (a file per value): here, so modules that
# name it (batch directories, recovery) need not import the transform and pandas with it.
SEGMENT = "time_chunk"
RESERVED_COLUMNS = ("__time", SEGMENT)  # written by the output itself: never a dimension

# Generated backfill supervisors are named <main-id>-backfill-<n>; a spec id of that form
# could collide with one (the schema refuses it, see ``properties.id.not``).
BACKFILL_ID = re.compile(r"^(?P<parent>.+)-backfill-(?P<n>[0-9]+)$")

# File names in the watched directory: ``<id>.reset.yaml`` is a marker, ``<id>.yaml`` a spec.
# Suffixes are compared case-insensitively everywhere (``Clicks.RESET.YAML`` is a marker).
MARKER_SUFFIXES = (".reset.yaml", ".reset.yml")
SPEC_SUFFIXES = (".yaml", ".yml")

_DURATION = re.compile(r"^(?P<n>[0-9]+(?:\.[0-9]+)?)(?P<unit>ms|s|m|h)$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


# The longest duration anything accepts (spec, settings): every duration is added to
# ``datetime.now()`` or to a monotonic clock somewhere, and a ``for: 100000000h`` overflowed
# the date (issue 41.1). Ten years is far beyond any useful wait and far inside what adds safely.
MAX_DURATION = 10 * 365 * 86400.0  # seconds
MAX_DURATION_TEXT = "87600h (10 years)"


class DurationOutOfRange(ValueError):
    """A well-formed duration longer than ``MAX_DURATION``."""


def parse_duration(text: str) -> float:
    """``"30s"`` -> 30.0 seconds; ``"500ms"`` -> 0.5. At most ``MAX_DURATION``."""
    m = _DURATION.match(text.strip())
    if not m:
        raise ValueError(f"not a duration: {text!r} (use e.g. 500ms, 30s, 5m, 1h)")
    seconds = float(m["n"]) * _UNIT_SECONDS[m["unit"]]
    if not seconds <= MAX_DURATION:  # also inf, from a number of hundreds of digits
        raise DurationOutOfRange(f"{text.strip()!r} is too long: at most {MAX_DURATION_TEXT}")
    return seconds


def parse_seconds(value: Any) -> float:
    """A setting's seconds: a number (``30``, ``0.5``) or a duration (``30s``), at most ``MAX_DURATION``."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        try:
            return parse_duration(str(value))
        except DurationOutOfRange:
            raise
        except ValueError:
            raise ValueError(f"{value!r} is not a number or duration like 30s") from None
    if not abs(seconds) <= MAX_DURATION:  # also nan and inf
        raise DurationOutOfRange(f"{value!r} is out of range: at most {MAX_DURATION:.0f} seconds "
                                 f"({MAX_DURATION_TEXT})")
    return seconds


_SIZE = re.compile(r"^(?P<n>[0-9]+(?:\.[0-9]+)?)\s*(?P<unit>B|KiB|MiB|GiB|TiB|kB|KB|MB|GB|TB)?$")
_UNIT_BYTES = {None: 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40,
               "kB": 10**3, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
DEFAULT_MAX_BATCH_BYTES = 512 << 20


def parse_size(value: int | str) -> int:
    """``"512MiB"`` -> 536870912; a plain number is bytes."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    m = _SIZE.match(str(value).strip())
    if not m:
        raise ValueError(f"not a size: {value!r} (use e.g. 64MiB, 512MiB, 2GiB, or a number of bytes)")
    return int(float(m["n"]) * _UNIT_BYTES[m["unit"]])


def file_stem(path: str | os.PathLike[str]) -> str:
    """The id a spec or marker file name claims: ``specs/clicks.reset.yaml`` -> ``clicks``.

    The one place that strips the suffix (the loader, its id recovery and the plan's
    rejected markers all use it): marker suffixes first, then spec suffixes, compared
    case-insensitively, the rest kept as written; a name with neither is returned whole.
    """
    name = os.fspath(path).replace("\\", "/").rstrip("/").rsplit("/", 1)[-1]
    lower = name.lower()
    for suffix in (*MARKER_SUFFIXES, *SPEC_SUFFIXES):
        if lower.endswith(suffix):
            return name[: -len(suffix)]
    return name


PositionKind = Literal["earliest", "latest", "timestamp", "offsets", "shiftBy"]


@dataclass(frozen=True)
class Position:
    """A startpoint: where a checkpoint should be moved (Samza's Startpoint types)."""

    kind: PositionKind
    timestamp: str | None = None  # ISO-8601 or relative like "-2h"
    offsets: Mapping[str, int] | None = None
    shift: int | None = None

    @classmethod
    def from_document(cls, doc: Any) -> Position:
        if doc in ("earliest", "latest"):
            return cls(kind=doc)
        if isinstance(doc, Mapping):
            if "timestamp" in doc:
                return cls(kind="timestamp", timestamp=str(doc["timestamp"]))
            if "offsets" in doc:
                return cls(kind="offsets", offsets={str(k): int(v) for k, v in doc["offsets"].items()})
            if "shiftBy" in doc:
                return cls(kind="shiftBy", shift=int(doc["shiftBy"]))
        raise ValueError(f"not a position: {doc!r}")

    def to_document(self) -> Any:
        if self.kind in ("earliest", "latest"):
            return self.kind
        if self.kind == "timestamp":
            return {"timestamp": self.timestamp}
        if self.kind == "offsets":
            return {"offsets": dict(self.offsets or {})}
        return {"shiftBy": self.shift}

    def __str__(self) -> str:
        doc = self.to_document()
        return doc if isinstance(doc, str) else json.dumps(doc, sort_keys=True)


@dataclass(frozen=True)
class KafkaSource:
    bootstrap_servers: str
    topic: str
    consumer_properties: Mapping[str, Any] = field(default_factory=dict)
    type: Literal["kafka"] = "kafka"


@dataclass(frozen=True)
class RabbitSource:
    uri: str
    streams: tuple[str, ...]
    type: Literal["rabbitmq"] = "rabbitmq"


Source = KafkaSource | RabbitSource


def source_from_document(doc: Mapping[str, Any]) -> Source:
    """A spec's ``source`` document as a typed source (secret references kept verbatim)."""
    if doc.get("type") == "kafka":
        return KafkaSource(
            bootstrap_servers=doc["bootstrapServers"],
            topic=doc["topic"],
            consumer_properties=dict(doc.get("consumerProperties") or {}),
        )
    if doc.get("type") == "rabbitmq":
        return RabbitSource(uri=doc["uri"], streams=tuple(doc["streams"]))
    raise ValueError(f"unknown source type: {doc.get('type')!r}")


def source_to_document(source: Source) -> dict[str, Any]:
    """The spec's ``source`` document for a source (references kept verbatim)."""
    if isinstance(source, KafkaSource):
        return {
            "type": "kafka",
            "bootstrapServers": source.bootstrap_servers,
            "topic": source.topic,
            "consumerProperties": dict(source.consumer_properties),
        }
    if isinstance(source, RabbitSource):
        return {"type": "rabbitmq", "uri": source.uri, "streams": list(source.streams)}
    raise TypeError(f"unknown source type: {source!r}")


@dataclass(frozen=True)
class Metric:
    name: str
    type: str  # count | longSum | doubleSum | longMin | longMax | doubleMin | doubleMax
    field: str | None = None


@dataclass(frozen=True)
class Dimension:
    """A dimension: its column ``name``, the ``type`` it is read as (string | long | double |
    boolean | timestamp | json) and the dotted ``path`` of its field (``(name,)`` when flat)."""

    name: str
    type: str = "string"
    path: tuple[str, ...] = ()

    @classmethod
    def from_document(cls, doc: str | Mapping[str, Any]) -> Dimension:
        if isinstance(doc, str):
            return cls(doc, "string", (doc,))
        name = str(doc["name"])
        path = tuple(str(doc["path"]).split(".")) if doc.get("path") else (name,)
        return cls(name, str(doc.get("type", "string")), path)


@dataclass(frozen=True)
class DataSchema:
    datasource: str
    timestamp_column: str
    timestamp_format: str = "auto"  # auto | iso | millis | seconds
    format: str = "json"
    dimensions: tuple[str, ...] = ()  # the dimension columns' names (``typed`` has the rest)
    metrics: tuple[Metric, ...] = ()
    segment_granularity: str = "hour"
    query_granularity: str = "none"
    rollup: bool = False
    # One per dimension, in order; empty: every dimension a flat string (as before typed ones).
    typed: tuple[Dimension, ...] = ()
    # The format's block of the spec (``avro:``, ``protobuf:``, ``csv:``), as written.
    format_options: Mapping[str, Any] = field(default_factory=dict, hash=False)
    schema_discovery: bool = False

    def dimension(self, name: str) -> Dimension:
        for d in self.typed:
            if d.name == name:
                return d
        return Dimension(name, "string", (name,))


@dataclass(frozen=True)
class BackfillStanza:
    request: str
    reset_to: Position
    task_count: int | None = None
    allow_rewind: bool = False
    reason: str | None = None


LagPolicyAction = Literal["resetToLatestAndBackfill", "alert"]


@dataclass(frozen=True)
class LagPolicy:
    """``lagPolicy:``: when the lag passes a threshold for ``for_seconds``, reset to latest with
    a backfill (``resetToLatestAndBackfill``) or only say so (``alert``). See ``control.lagpolicy``."""

    max_records: int | None = None
    max_lag: float | None = None  # seconds: age of the oldest record not yet ingested
    for_seconds: float = 0.0
    action: LagPolicyAction = "alert"
    cooldown: float = 3600.0  # seconds: at most one automatic reset per cooldown
    backfill_task_count: int | None = None
    document: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_document(cls, doc: Mapping[str, Any]) -> LagPolicy:
        return cls(
            max_records=int(doc["maxRecords"]) if doc.get("maxRecords") is not None else None,
            max_lag=parse_duration(str(doc["maxLag"])) if doc.get("maxLag") is not None else None,
            for_seconds=parse_duration(str(doc.get("for", "0s"))),
            action=doc.get("action", "alert"),
            cooldown=parse_duration(str(doc.get("cooldown", "1h"))),
            backfill_task_count=doc.get("backfillTaskCount"),
            document=dict(doc),
        )


@dataclass(frozen=True)
class SupervisorSpec:
    """One supervisor as declared by one spec file (references unresolved)."""

    id: str
    source: Source
    data_schema: DataSchema
    suspended: bool = False
    start_from: Position = Position("earliest")
    task_count: int = 1
    task_duration: float = 30.0  # seconds
    max_batch_records: int = 1_000_000
    max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES
    backfill: BackfillStanza | None = None
    # A changed source identity (topic, cluster, vhost, removed streams) drops the old
    # checkpoints and starts from startFrom only when this says so; refused otherwise.
    fresh_start: bool = False
    # A checkpoint behind the broker's retention: "unhealthy" (stop, report the count) or
    # "continue" (go on from earliest, record the loss).
    on_retention_loss: Literal["unhealthy", "continue"] = "unhealthy"
    lag_policy: LagPolicy | None = None
    document: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @functools.cached_property  # the daemon keeps specs across passes and compares hashes every pass
    def spec_hash(self) -> str:
        return document_hash(self.document)

    @classmethod
    def from_document(cls, doc: Mapping[str, Any]) -> SupervisorSpec:
        source = source_from_document(doc["source"])
        ds = doc["dataSchema"]
        ts = ds["timestamp"]
        gran = ds.get("granularity") or {}
        dims = tuple(Dimension.from_document(d) for d in ds.get("dimensions") or ())
        data_schema = DataSchema(
            datasource=ds["datasource"],
            timestamp_column=ts["column"],
            timestamp_format=ts.get("format", "auto"),
            format=ds.get("format", "json"),
            dimensions=tuple(d.name for d in dims),
            typed=dims,
            format_options=dict(ds.get(ds.get("format", "json")) or {}),
            schema_discovery=bool(ds.get("schemaDiscovery", False)),
            metrics=tuple(
                Metric(name=m["name"], type=m["type"], field=m.get("field"))
                for m in ds.get("metrics") or ()
            ),
            segment_granularity=gran.get("segment", "hour"),
            query_granularity=gran.get("query", "none"),
            rollup=bool(gran.get("rollup", False)),
        )
        bf = doc.get("backfill")
        backfill = None
        if bf:
            backfill = BackfillStanza(
                request=str(bf["request"]),
                reset_to=Position.from_document(bf.get("resetTo", "latest")),
                task_count=bf.get("taskCount"),
                allow_rewind=bool(bf.get("allowRewind", False)),
                reason=bf.get("reason"),
            )
        return cls(
            id=doc["id"],
            source=source,
            data_schema=data_schema,
            suspended=bool(doc.get("suspended", False)),
            start_from=Position.from_document(doc.get("startFrom", "earliest")),
            task_count=int(doc.get("taskCount", 1)),
            task_duration=parse_duration(str(doc.get("taskDuration", "30s"))),
            max_batch_records=int(doc.get("maxBatchRecords", 1_000_000)),
            max_batch_bytes=parse_size(doc.get("maxBatchBytes", DEFAULT_MAX_BATCH_BYTES)),
            backfill=backfill,
            fresh_start=bool(doc.get("freshStart", False)),
            on_retention_loss=doc.get("onRetentionLoss", "unhealthy"),
            lag_policy=LagPolicy.from_document(doc["lagPolicy"]) if doc.get("lagPolicy") else None,
            document=json.loads(json.dumps(doc)),
        )


@dataclass(frozen=True)
class Marker:
    """A reset request dropped as ``<id>.reset.yaml`` beside the specs."""

    supervisor_id: str
    path: str
    token: str  # hash of the file's name and bytes
    # The file's identity on disk (device, inode, ctime): the same bytes dropped again
    # for a new incident are a new request; the same file seen again is not.
    appearance: str = ""
    reset_to: Position = Position("latest")
    backfill: bool = True
    backfill_task_count: int | None = None
    allow_rewind: bool = False
    reason: str | None = None


def canonical_json(doc: Any) -> str:
    """The one canonical JSON text of a document: sorted keys, no spaces, anything else as str.

    What the store writes (specs, request results, audit details) and what ``document_hash``
    hashes, so a hash is always of the text the database holds."""
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), default=str)


def document_hash(doc: Mapping[str, Any]) -> str:
    """A stable hash of a spec document (key order and YAML formatting do not matter)."""
    return hashlib.sha256(canonical_json(doc).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class PartitionRange:
    """Offsets ``[start, end)`` of one partition."""

    partition: str
    start: int
    end: int

    @property
    def size(self) -> int:
        return max(0, self.end - self.start)
