"""Settings, declared once: each has a default, an environment variable, a config-file key
and help text. Precedence: command line > environment > config file > default.

The config file is YAML (``--config``, ``RECONCILER_CONFIG``, else
``/etc/stream-reconciler/config.yaml`` when it exists). SIGHUP re-reads it and the
daemon swaps the whole ``Settings`` object, never single fields.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from reconciler import catalogsettings
from reconciler.errors import PermanentError, printable
from reconciler.model import parse_seconds
from reconciler.sparkurls import CONNECT_PORT, check_conf, check_master, endpoints  # noqa: F401  (callers import them from here)

DEFAULT_CONFIG = Path("/etc/stream-reconciler/config.yaml")


def _opt(default: Any, env: str, key: str, help: str, shown: str | None = None) -> Any:
    """A setting: its default, environment variable, config-file key and help text, and
    ``shown``, the default as docs/settings.md's table says it (Markdown) when the value
    alone does not say it (scripts/gen_settings_table.py writes that table from these)."""
    metadata = {"env": env, "key": key, "help": help}
    if shown is not None:
        metadata["shown"] = shown
    return field(default=default, metadata=metadata)


@dataclass(frozen=True)
class Settings:
    specs: str = _opt("specs", "RECONCILER_SPECS", "specs", "the watched directory of supervisor specs and markers")
    state_dir: str = _opt("", "RECONCILER_STATE_DIR", "stateDir",
                          "state directory: the database (SQLite by default), generated backfill specs "
                          "(default: $STATE_DIRECTORY under systemd, else ./state)",
                          shown="`$STATE_DIRECTORY`, else `state`")
    db: str = _opt("", "RECONCILER_DB", "db", "SQLAlchemy URL of the metadata database, e.g. "
                   "postgresql://user@host/db (default: SQLite in the state dir)",
                   shown="SQLite in the state dir")
    segments: str = _opt("", "RECONCILER_SEGMENTS", "segments", "warehouse of the output Iceberg tables, "
                         "<segments>/default/<datasource>/: a local or shared directory (or file://...), or an "
                         "object store, s3://bucket/prefix (default: <state dir>/segments)",
                         shown="`<stateDir>/segments`")
    object_store: dict[str, str] = field(default_factory=dict, metadata={
        "env": "RECONCILER_OBJECT_STORE", "key": "objectStore",
        "help": "how to reach an s3:// warehouse, over the AWS environment (AWS_ENDPOINT_URL, AWS_REGION, "
                "AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_PROFILE and its files): endpoint, region, "
                "accessKeyId, secretAccessKey, sessionToken, pathStyle, executorEndpoint (the endpoint as the "
                "Spark executors reach it, when not the daemon's) as key=value, repeatable (environment: "
                "separated by ';'; config file: a map); values may be ${env:...} or ${file:...} references",
        "shown": "none (the AWS environment)", "metavar": "key=value"})
    catalog: dict[str, Any] = field(default_factory=dict, metadata={
        "env": "RECONCILER_CATALOG", "key": "catalog",
        "help": "the Iceberg catalog of the output tables, as JSON (config file: a map): {\"type\": \"sql\"} "
                "(the metadata database, default), glue or rest, with namespace and pyiceberg's properties "
                "(values may be ${env:...} or ${file:...} references); see docs/settings.md",
        "shown": "`sql` (the metadata database)", "metavar": "JSON"})
    spark_master: str = _opt("local[*]", "RECONCILER_SPARK_MASTER", "sparkMaster",
                             "Spark master: local[*], spark://host:7077, or Spark Connect sc://host:15002")
    spark_conf: dict[str, str] = field(default_factory=dict, metadata={
        "env": "RECONCILER_SPARK_CONF", "key": "spark",
        "help": "a Spark setting as key=value, repeatable (environment: entries separated by ';' or "
                "newlines; config file: a map of spark.* keys); merged over file < environment < command line",
        "shown": "none (a session the daemon starts gets `spark.driver.memory: 512m`; not on Spark Connect)",
        "metavar": "key=value"})
    tick_interval: float = _opt(30.0, "RECONCILER_TICK_INTERVAL", "tickInterval",
                                "seconds between safety-net reconcile passes (file events reconcile at once)")
    debounce: float = _opt(0.3, "RECONCILER_DEBOUNCE", "debounce", "seconds of quiet after file events before a reconcile")
    max_termination_share: float = _opt(0.5, "RECONCILER_MAX_TERMINATION_SHARE", "maxTerminationShare",
                                        "share of supervisors one tick may terminate before terminations are held")
    allow_insecure_specs: bool = _opt(False, "RECONCILER_ALLOW_INSECURE_SPECS", "allowInsecureSpecs",
                                      "true accepts a spec directory, specs and markers writable by others (o+w, "
                                      "or g+w for a group not the daemon's); by default they are refused with a "
                                      "warning naming path and mode")
    compact_interval: float = _opt(3600.0, "RECONCILER_COMPACT_INTERVAL", "compactInterval",
                                   "seconds between compactions of closed time partitions by the leader "
                                   "(0 disables; by hand: reconciler compact)")
    rolling_compaction: float = _opt(30.0, "RECONCILER_ROLLING_COMPACTION", "rollingCompaction",
                                     "seconds between merges of the small files of time partitions still being "
                                     "written, by the leader (sooner after 50 new files; 0 disables)")
    compact_lateness: float = _opt(3600.0, "RECONCILER_COMPACT_LATENESS", "compactLateness",
                                   "a time partition is compacted once its end is this many seconds in the past")
    maintain_interval: float = _opt(900.0, "RECONCILER_MAINTAIN_INTERVAL", "maintainInterval",
                                    "seconds between snapshot expiry and orphan clean-up by the leader "
                                    "(0 disables; by hand: reconciler maintain)")
    snapshot_retention: float = _opt(3600.0, "RECONCILER_SNAPSHOT_RETENTION", "snapshotRetention",
                                     "seconds a table snapshot is kept at most (the leader's maintenance expires "
                                     "older ones); verify keeps the offsets of expired snapshots")
    snapshots_kept: int = _opt(25, "RECONCILER_SNAPSHOTS_KEPT", "snapshotsKept",
                                 "snapshots a table keeps at most: each publish expires the ones beyond, so a "
                                 "commit costs the same after a day of one-second batches (time travel reaches "
                                 "back this many commits; 0 keeps them until snapshotRetention)")
    reader_grace: float = _opt(600.0, "RECONCILER_READER_GRACE", "readerGrace", "seconds a replaced table version "
                               "stays readable: what a commit unreferences is deleted this long after it (0: at once)")
    lease_ttl: float = _opt(15.0, "RECONCILER_LEASE_TTL", "leaseTtl",
                           "seconds a leader lease lasts without renewal: a standby takes over within this time")
    http: str = _opt("127.0.0.1:9187", "RECONCILER_HTTP", "http",
                     "address of the status page /, /metrics and /healthz (off: none; taken: no start)")
    webhook: str = _opt("", "RECONCILER_WEBHOOK", "webhook",
                        "URL(s) receiving every audit event as a JSON POST: one, or several separated by commas "
                        "(config file: a string or a list); http or https, without user:password@", shown="none")
    lag_interval: float = _opt(5.0, "RECONCILER_LAG_INTERVAL", "lagInterval",
                               "seconds between the leader's lag observations (lag in records and time, lag "
                               "policies, the status page's charts); 0 disables them")
    log_format: str = _opt("text", "RECONCILER_LOG_FORMAT", "logFormat", "text or json (one event per line on stderr)")
    log_level: str = _opt("INFO", "RECONCILER_LOG_LEVEL", "logLevel", "DEBUG, INFO, WARNING or ERROR")
    secrets_dir: str = _opt("", "RECONCILER_SECRETS_DIR", "secretsDir",
                            "the only directory ${file:} references (and librdkafka key, keystore and keytab "
                            "paths) may read (default: $CREDENTIALS_DIRECTORY under systemd, else none)")
    secret_env: str = _opt("", "RECONCILER_SECRET_ENV", "secretEnv",
                           "the only environment variables ${env:} references may read, comma-separated "
                           "(default: none)")
    secret_grants: str = _opt("", "RECONCILER_SECRET_GRANTS", "secretGrants", "which specs may use which secrets: "
                              "SECRET=SPECS;... (config file: a map); SECRET file:GLOB or env:GLOB, SPECS id globs; "
                              "once set, strict; unset, every spec may use every secret (deprecated)", shown="none")
    step_timeout: float = _opt(600.0, "RECONCILER_STEP_TIMEOUT", "stepTimeout",
                               "seconds one step of a supervisor (a batch) may take before the supervisor is "
                               "reported UNHEALTHY and its runtime thread replaced, so the others keep theirs")

    @property
    def state_path(self) -> Path:
        return Path(self.state_dir)

    @property
    def db_url(self) -> str:
        return self.db or f"sqlite:///{(self.state_path / 'reconciler.db').absolute()}"

    @property
    def segments_dir(self) -> Path:
        """The local warehouse directory (``warehouse`` names an object store's too)."""
        if self.remote_warehouse:
            raise PermanentError(f"setting segments: {self.segments} is an object store, not a directory")
        path = self.segments[len("file://"):] if self.segments.startswith("file://") else self.segments
        return Path(path) if path else self.state_path / "segments"

    @property
    def warehouse(self) -> str:
        """The tables' warehouse as a location: ``s3://bucket/prefix``, or an absolute path."""
        if urlsplit(self.segments).scheme in OBJECT_SCHEMES:
            return self.segments.rstrip("/")
        path = self.segments[len("file://"):] if self.segments.startswith("file://") else self.segments
        return str((Path(path) if path else self.state_path / "segments").absolute())

    @property
    def remote_warehouse(self) -> bool:
        return urlsplit(self.segments).scheme in OBJECT_SCHEMES

    @property
    def webhooks(self) -> tuple[str, ...]:
        """The ``webhook`` setting's URLs (checked by ``load``)."""
        return webhook_urls(self.webhook)


_FLOATS = {"tick_interval", "debounce", "max_termination_share", "lease_ttl", "compact_interval", "compact_lateness",
           "rolling_compaction",
           "maintain_interval", "snapshot_retention", "lag_interval", "step_timeout", "reader_grace"}
_INTS = {"snapshots_kept"}
MULTIPLE = {"spark_conf", "object_store"}  # options given once per value on the command line
_BOOLS = {"allow_insecure_specs"}


def describe() -> list[tuple[str, str, str, str]]:
    """(field, env var, config key, help) of every setting: for docs and --help."""
    return [(f.name, f.metadata["env"], f.metadata["key"], f.metadata["help"]) for f in fields(Settings)]


def load(cli: dict[str, Any] | None = None, config: str | None = None, env: dict[str, str] | None = None) -> Settings:
    env = dict(os.environ if env is None else env)
    cli = {k: v for k, v in (cli or {}).items() if v is not None and v != ()}
    file_values = _read_config(config or env.get("RECONCILER_CONFIG"))
    values: dict[str, Any] = {"spark_conf": _spark_conf(cli, env, file_values),
                              "object_store": _object_store(cli, env, file_values),
                              "catalog": catalogsettings.parse(cli, env, file_values)}
    for f in fields(Settings):
        if f.name in MULTIPLE or f.name == "catalog":
            continue
        if f.name in cli:
            values[f.name] = cli[f.name]
        elif f.metadata["env"] in env:
            values[f.name] = env[f.metadata["env"]]
        elif f.metadata["key"] in file_values:
            values[f.name] = file_values[f.metadata["key"]]
    for name in _FLOATS & values.keys():
        values[name] = _seconds_or_float(name, values[name])
    for name in _BOOLS & values.keys():
        values[name] = _bool(name, values[name])
    if values.get("http") is False:  # YAML reads `http: off` as false
        values["http"] = "off"
    if isinstance(values.get("webhook"), list | tuple):  # the config file may list them
        values["webhook"] = ",".join(str(u) for u in values["webhook"])
    for name in _INTS & values.keys():
        values[name] = _int(name, values[name])
    settings = replace(Settings(), **values)
    if not settings.state_dir:
        settings = replace(settings, state_dir=env.get("STATE_DIRECTORY", "").split(":")[0] or "state")
    settings = replace(settings, secrets_dir=str(settings.secrets_dir or env.get("CREDENTIALS_DIRECTORY", "")),
                       secret_env=_names("secretEnv", settings.secret_env))
    if not 0.0 <= settings.max_termination_share <= 1.0:
        raise PermanentError(f"maxTerminationShare must be between 0 and 1, not {settings.max_termination_share}")
    for name in ("tick_interval", "lease_ttl", "step_timeout"):
        if getattr(settings, name) <= 0:
            raise PermanentError(f"setting {name} must be positive")
    if settings.log_format not in ("text", "json"):
        raise PermanentError(f"logFormat must be text or json, not {settings.log_format!r}")
    if str(settings.log_level).upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise PermanentError(f"logLevel must be DEBUG, INFO, WARNING or ERROR, not {settings.log_level!r}")
    if bad := [(k, v) for k, v in (("lagInterval", settings.lag_interval), ("readerGrace", settings.reader_grace)) if v < 0]:
        raise PermanentError(f"{bad[0][0]} must be 0 (off) or positive, not {bad[0][1]}")
    webhook_urls(settings.webhook)
    check_segments(settings.segments)
    _check_spark(settings)
    check_http(settings.http)
    if settings.db:
        check_db(settings.db)
    return settings


def webhook_urls(text: str) -> tuple[str, ...]:
    """``"https://a/x, http://b:8080/y"`` -> both URLs; a malformed one (a space or a control character too:
    http.client quotes those escaped) is refused naming its scheme and host only, escaped (the rest is a token)."""
    urls = tuple(u.strip() for u in str(text or "").split(",") if u.strip())
    for url in urls:
        try:
            parts = urlsplit(url)
            parts.port  # noqa: B018 - raises ValueError for a port that is not a number
        except ValueError:
            parts = None
        shown = printable(f"{parts.scheme}://{parts.hostname or ''}" if parts else "a URL")
        if not parts or parts.scheme not in ("http", "https") or not parts.hostname or " " in url or not url.isprintable():
            raise PermanentError(f"webhook: {shown}... is not an http(s) URL with a host, no space nor control character "
                                 "(set --webhook / RECONCILER_WEBHOOK / webhook: one URL or several separated by commas)")
        if "@" in parts.netloc:  # never sent as Basic auth; urllib put the password in a traceback
            raise PermanentError(f"webhook: {shown}... carries credentials (user:password@): "
                                 "refused; put a token in the URL's path (--webhook / RECONCILER_WEBHOOK / webhook)")
    return urls


_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _names(key: str, value: Any) -> str:
    """A comma-separated list (a YAML list in the config file) of environment variable names."""
    items = value if isinstance(value, (list, tuple)) else str(value or "").split(",")
    names = [str(n).strip() for n in items if str(n).strip()]
    bad = [n for n in names if not _ENV_NAME.match(n)]
    if bad:
        raise PermanentError(f"setting {key}: {', '.join(map(repr, bad))} is not an environment variable name "
                             "(letters, digits and _, separated by commas)")
    return ",".join(names)


# Object stores a warehouse may be on (pyarrow's filesystems and pyiceberg's file IO read them).
OBJECT_SCHEMES = ("s3", "s3a", "gs", "gcs")
OBJECT_STORE_KEYS = ("endpoint", "region", "accessKeyId", "secretAccessKey", "sessionToken", "pathStyle",
                     "executorEndpoint")


def check_segments(value: str) -> None:
    """A directory, ``file://`` path, or ``s3://bucket[/prefix]``; any other URL is refused here."""
    where = "setting segments (--segments, RECONCILER_SEGMENTS)"
    text = str(value or "")
    if "://" not in text or text.startswith("file://"):
        return
    parts = urlsplit(text)
    if parts.scheme not in ("s3", "s3a"):
        raise PermanentError(f"{where}: {parts.scheme}:// is not supported; use a directory, file:///path "
                             "or s3://bucket/prefix")
    if not parts.netloc or parts.query or parts.fragment or "@" in parts.netloc:
        shown = parts.netloc.rpartition("@")[2]  # never the credentials a URL may carry
        raise PermanentError(f"{where}: {parts.scheme}://{shown}... is not s3://bucket/prefix "
                             "(credentials go in the AWS environment or objectStore, never in the URL)")


def _object_store(cli: dict[str, Any], env: dict[str, str], file_values: dict[str, Any]) -> dict[str, str]:
    """The ``objectStore:`` map of the config file, then the environment's, then the command
    line's entries; values are kept as written (references resolved by ``table.storage``)."""
    value = file_values.get("objectStore") or {}
    if not isinstance(value, dict):
        raise PermanentError("config file: objectStore must be a map, e.g. objectStore: "
                             "{endpoint: https://s3.example.com, secretAccessKey: '${env:S3_SECRET}'}")
    out = {}
    for k, v in value.items():
        if isinstance(v, (dict, list)) or v is None:  # never echoed: it may be a secret
            raise PermanentError(f"config file: objectStore.{k} must be a single value (a string, or a "
                                 "${env:...}/${file:...} reference)")
        out[str(k)] = _spark_value(v)
    if env.get("RECONCILER_OBJECT_STORE"):
        items = [x for x in re.split(r"[;\n]", env["RECONCILER_OBJECT_STORE"]) if x.strip()]
        out.update(_store_pairs("RECONCILER_OBJECT_STORE", items))
    raw = cli.get("object_store") or ()
    out.update(_store_pairs("--object-store", [raw] if isinstance(raw, str) else raw))
    unknown = sorted(set(out) - set(OBJECT_STORE_KEYS))
    if unknown:
        # A key that does not look like one may be a credential typed without its '='.
        shown = [k if re.fullmatch(r"[A-Za-z][A-Za-z0-9_.-]{0,39}", k) else "(a key not shown: it may hold a "
                 "credential)" for k in unknown]
        raise PermanentError(f"setting objectStore: unknown key(s) {', '.join(shown)}; "
                             f"known: {', '.join(OBJECT_STORE_KEYS)}")
    return out


def check_http(address: str) -> None:
    """``HOST:PORT`` (or ``:PORT``) with a numeric port, or off (or empty) to disable."""
    if not address or str(address).strip().lower() == "off":  # daemon.http.http_off
        return
    _, sep, port = str(address).rpartition(":")
    if not sep or not (port.isascii() and port.isdigit()) or not 0 <= int(port) < 65536:  # "²".isdigit()
        raise PermanentError(f"setting http (--http, RECONCILER_HTTP): {address!r} is not HOST:PORT with a port "
                             "number, e.g. 127.0.0.1:9187 (off disables it)")


def check_db(url: str) -> None:
    """A SQLAlchemy URL this installation can open, named by the setting when it is not."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    where = "setting db (--db, RECONCILER_DB)"
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError) as exc:
        why = "its port is not a number" if "int()" in str(exc) else _no_password(str(exc), url)
        raise PermanentError(f"{where}: not a database URL ({why}); "
                             "e.g. postgresql://user@host/reconciler or sqlite:////var/lib/reconciler.db") from None
    backend = parsed.drivername.split("+", 1)[0]
    if backend in ("postgres", "pg", "pgsql"):
        raise PermanentError(f"{where}: the SQLAlchemy name of PostgreSQL is postgresql://, not {backend}://")
    try:
        parsed.get_dialect()
    except NoSuchModuleError:
        raise PermanentError(f"{where}: unknown database kind {parsed.drivername!r}; use postgresql:// "
                             "(or postgresql+psycopg://) or sqlite:///PATH") from None


def _no_password(text: str, url: str) -> str:
    """An error text about ``url`` with its password, if it quotes it, hidden."""
    userinfo = url.partition("://")[2].split("/", 1)[0].rpartition("@")[0]
    password = userinfo.partition(":")[2]
    return text.replace(password, "***") if password else text


def _check_spark(settings: Settings) -> None:
    """A malformed master URL or Spark key is refused here, once, not by every batch."""
    check_master(settings.spark_master)
    check_conf(settings.spark_conf)


def _spark_conf(cli: dict[str, Any], env: dict[str, str], file_values: dict[str, Any]) -> dict[str, str]:
    """The ``spark:`` map of the config file, then the environment's entries, then the
    command line's: a key given later wins, the others are kept."""
    conf = {str(k): _spark_value(v) for k, v in _file_spark_map(file_values.get("spark")).items()}
    if env.get("RECONCILER_SPARK_CONF"):
        items = [x for x in re.split(r"[;\n]", env["RECONCILER_SPARK_CONF"]) if x.strip()]
        conf.update(_pairs("RECONCILER_SPARK_CONF", items))
    raw = cli.get("spark_conf") or ()
    conf.update(_pairs("--spark-conf", [raw] if isinstance(raw, str) else raw))
    return conf


def _file_spark_map(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise PermanentError("config file: spark must be a map of Spark settings, e.g. "
                             "spark: {spark.executor.memory: 2g}")
    return value


def _spark_value(value: Any) -> str:
    if isinstance(value, bool):  # YAML's true is Spark's "true", not Python's "True"
        return "true" if value else "false"
    if isinstance(value, (dict, list)) or value is None:
        raise PermanentError(f"config file: a spark setting must be a single value, not {value!r}")
    return str(value)


def _pairs(where: str, items: Any) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = str(item).strip().partition("=")
        if not sep or not key.strip():
            raise PermanentError(f"{where}: {item!r} is not key=value, e.g. spark.executor.memory=2g")
        out[key.strip()] = value.strip()
    return out


def _store_pairs(where: str, items: Any) -> dict[str, str]:
    """``_pairs`` for ``objectStore`` entries, whose values may be credentials: a malformed
    entry is refused naming its position and the keys it may start with, never its text
    (printed, and journaled, before any scrubber has learnt the secret)."""
    out = {}
    for n, item in enumerate(items, 1):
        key, sep, value = str(item).strip().partition("=")
        if not sep or not key.strip():
            raise PermanentError(f"{where}: entry {n} is not key=value (its text is not shown: it may hold a "
                                 f"credential), e.g. endpoint=https://s3.example.com; keys: "
                                 f"{', '.join(OBJECT_STORE_KEYS)}")
        out[key.strip()] = value.strip()
    return out


def _int(name: str, value: Any) -> int:
    try:
        number = int(str(value).strip())
    except ValueError:
        raise PermanentError(f"setting {name}: {value!r} is not a whole number") from None
    if number < 0:
        raise PermanentError(f"setting {name} must not be negative, not {number}")
    return number


def _seconds_or_float(name: str, value: Any) -> float:
    try:
        return parse_seconds(value)  # bounded: each is added to a clock (issue 41.1)
    except ValueError as exc:
        raise PermanentError(f"setting {name}: {exc}") from None


def _bool(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off", ""):
        return False
    raise PermanentError(f"setting {name}: {value!r} is not true or false")


def _read_config(path: str | None) -> dict[str, Any]:
    if path is None:
        if not DEFAULT_CONFIG.exists():
            return {}
        path = str(DEFAULT_CONFIG)
    import yaml  # here: without a config file, a command never needs PyYAML

    try:
        doc = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    except OSError as exc:
        raise PermanentError(f"config file {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise PermanentError(f"config file {path}: not valid YAML: {exc}") from None
    if not isinstance(doc, dict):
        raise PermanentError(f"config file {path}: expected a mapping of settings")
    known = {f.metadata["key"] for f in fields(Settings)}
    unknown = sorted(set(doc) - known)
    if unknown:
        raise PermanentError(f"config file {path}: unknown setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    return doc
