"""The warehouse's files, on a local (or mounted) filesystem or in an object store, through
one layer: pyarrow's filesystems (``pyarrow.fs``: local, S3 and S3-compatible stores such
as MinIO or Ceph, GCS). pyiceberg's file IO reads and writes the table's own files with
the same settings (``iceberg_properties``).

What a local directory gives and an object store does not, and what stands in for it:

* **atomic rename**: never needed. Every file is written once under a name no one else
  uses (a write's id or tag), and a PUT is atomic: a reader sees the whole object or none;
* **fsync**: on an object store a PUT that returned is durable, so ``sync`` has nothing to
  do; on local disk it fsyncs the files and their directories (``durable.py``);
* **directories**: an object store has prefixes; ``list`` lists by prefix, recursively,
  and ``delete_dir`` deletes every object under one.

Locations are URIs as the tables' metadata holds them (``s3://bucket/key``), or plain
paths (``file://`` accepted) for a local warehouse.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from urllib.parse import urlsplit

import pyarrow.fs as pafs

from reconciler.settings import OBJECT_SCHEMES, Settings
from reconciler.table import durable
from reconciler.table.locations import local_path

log = logging.getLogger(__name__)

# An S3-compatible store behind an endpoint answers in any region; without one pyiceberg
# would ask AWS itself where the bucket is (a call to the internet on every new client).
DEFAULT_REGION = "us-east-1"
# Seconds: a store that went away fails the batch soon, not after the SDK's minutes.
CONNECT_TIMEOUT = 5.0
REQUEST_TIMEOUT = 60.0


@dataclass(frozen=True)
class ObjectStore:
    """How to reach the object store: the ``objectStore`` map of the config file (values may
    be secret references, resolved before this is built) over the AWS environment
    (``AWS_ENDPOINT_URL``, ``AWS_REGION``, ``AWS_ACCESS_KEY_ID``, ...). Never in a spec."""

    endpoint: str | None = None
    region: str | None = None
    access_key_id: str | None = None
    # Never in a repr: an object that ends up in a message must not carry them.
    secret_access_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    path_style: bool | None = None
    executor_endpoint: str | None = None  # the endpoint as the executors reach it, if not ``endpoint``

    @classmethod
    def from_environment(cls, overrides: Mapping[str, str] | None = None,
                         env: Mapping[str, str] | None = None) -> ObjectStore:
        env = os.environ if env is None else env
        o = dict(overrides or {})
        path_style = o.get("pathStyle")
        return cls(
            endpoint=o.get("endpoint") or env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or None,
            region=o.get("region") or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or None,
            access_key_id=o.get("accessKeyId") or env.get("AWS_ACCESS_KEY_ID") or None,
            secret_access_key=o.get("secretAccessKey") or env.get("AWS_SECRET_ACCESS_KEY") or None,
            session_token=o.get("sessionToken") or env.get("AWS_SESSION_TOKEN") or None,
            path_style=None if path_style is None else str(path_style).lower() in ("1", "true", "yes"),
            executor_endpoint=o.get("executorEndpoint") or None,
        )

    @classmethod
    def from_settings(cls, settings: Settings, env: Mapping[str, str] | None = None) -> ObjectStore:
        """The ``objectStore`` setting (references resolved, with this process's grants) over
        the AWS environment. Every credential is taught to the log scrubber."""
        from reconciler.errors import PermanentError
        from reconciler.spec import secrets

        resolved = {}
        for key, value in settings.object_store.items():
            try:
                resolved[key] = secrets.resolve(value)
            except PermanentError as exc:
                raise PermanentError(f"setting objectStore.{key}: {exc}") from None
        store = cls.from_environment(resolved, env)
        if store.endpoint and "@" in store.endpoint.rpartition("://")[2].split("/", 1)[0]:
            raise PermanentError(f"setting objectStore.endpoint (or AWS_ENDPOINT_URL): {_shown_endpoint(store.endpoint)} "
                                 "is given with credentials (user:password@), which are refused: give them as "
                                 "objectStore accessKeyId and secretAccessKey (references allowed) or in the AWS "
                                 "environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)")
        for value in store.secrets():
            secrets.scrubber.learn(value)
        return store

    def secrets(self) -> list[str]:
        """The values the log scrubber must know."""
        return [v for v in (self.secret_access_key, self.session_token) if v]

    def public(self) -> ObjectStore:
        """Without credentials: what may travel to the executors in a Spark job's options
        (visible in Spark's UI and plans). Executors take their credentials from their own
        environment, profile or instance role, the AWS SDK's chain, as the daemon does."""
        return replace(self, access_key_id=None, secret_access_key=None, session_token=None)

    def to_json(self) -> str:
        """The public settings as ``objectStore`` keys (``from_environment``'s overrides)."""
        public = {"endpoint": self.executor_endpoint or self.endpoint, "region": self.region,
                  "pathStyle": self.path_style}
        return json.dumps({k: v for k, v in public.items() if v is not None}, sort_keys=True)

    def s3(self, *, allow_bucket_creation: bool = False) -> pafs.S3FileSystem:
        kw: dict = {}
        if self.endpoint:
            parts = urlsplit(self.endpoint if "://" in self.endpoint else f"https://{self.endpoint}")
            kw["endpoint_override"] = parts.netloc
            kw["scheme"] = parts.scheme or "https"
        if self.region or self.endpoint:
            kw["region"] = self.region or DEFAULT_REGION
        if self.access_key_id:
            kw["access_key"] = self.access_key_id
            kw["secret_key"] = self.secret_access_key
            if self.session_token:
                kw["session_token"] = self.session_token
        if self.path_style is not None or self.endpoint:
            kw["force_virtual_addressing"] = not (self.path_style if self.path_style is not None else True)
        return pafs.S3FileSystem(allow_bucket_creation=allow_bucket_creation, connect_timeout=CONNECT_TIMEOUT,
                                 request_timeout=REQUEST_TIMEOUT, **kw)

    def iceberg_properties(self) -> dict[str, str]:
        """The same settings as pyiceberg's ``PyArrowFileIO`` takes them."""
        out = {}
        if self.endpoint:
            out["s3.endpoint"] = self.endpoint if "://" in self.endpoint else f"https://{self.endpoint}"
        if self.region or self.endpoint:
            out["s3.region"] = self.region or DEFAULT_REGION
        out["s3.connect-timeout"] = str(CONNECT_TIMEOUT)
        out["s3.request-timeout"] = str(REQUEST_TIMEOUT)
        if self.access_key_id:
            out["s3.access-key-id"] = self.access_key_id
            out["s3.secret-access-key"] = self.secret_access_key or ""
            if self.session_token:
                out["s3.session-token"] = self.session_token
        if self.path_style is not None or self.endpoint:
            out["s3.force-virtual-addressing"] = str(not (self.path_style if self.path_style is not None
                                                       else True)).lower()
        return out


_AWS_ERROR = re.compile(r"AWS Error (?P<code>[A-Z_]+)[^:]*?(?: during (?P<op>\w+) operation)?: (?P<why>[^\n]+)")


def unreachable_reason(exc: BaseException) -> str | None:
    """The object store's own words when ``exc`` (or the worker error Spark wraps around
    one) is the AWS SDK failing to reach or use the store; None for any other error. What
    ``status`` shows for an UNHEALTHY supervisor, instead of a page of traceback."""
    text = f"{exc}\n{exc.__cause__ or ''}"
    m = _AWS_ERROR.search(text)
    if m is None:
        return None
    store = current()
    where = _shown_endpoint(store.endpoint) if store.endpoint else "AWS S3"
    why = m["why"].strip().rstrip(".")
    op = f" ({m['op']})" if m["op"] else ""
    return f"the warehouse's object store {where} failed: {m['code']}{op}: {why}"


def _shown_endpoint(endpoint: str) -> str:
    """An endpoint as messages show it: never the user information (refused by ``from_settings``;
    an AWS_ENDPOINT_URL may still carry it)."""
    scheme, sep, rest = endpoint.rpartition("://")
    netloc, slash, path = rest.partition("/")
    return f"{scheme}{sep}{netloc.rpartition('@')[2]}{slash}{path}"


def is_object_store(location: str | os.PathLike[str]) -> bool:
    return urlsplit(str(location)).scheme in OBJECT_SCHEMES


# -- the process's object store -----------------------------------------------------------------
# Configured once from the settings (``configure``, by the command line and the daemon);
# without that, the AWS environment. Storages are cached per bucket: a pyarrow S3 client
# is thread-safe and costs a handshake to build.

_lock = threading.Lock()
_configured: ObjectStore | None = None
_storages: dict[str, Storage] = {}


def configure(store: ObjectStore | None) -> None:
    """Use ``store`` for every warehouse location of this process from now on."""
    global _configured
    with _lock:
        _configured = store
        _storages.clear()


def configure_from(settings: Settings) -> ObjectStore:
    """``configure`` with the settings' object store. Credentials the config file gave (not
    the environment) are put into this process's environment, which the Spark workers this
    process starts inherit (``local[*]``): never into Spark's configuration, which Spark
    shows and logs. Executors elsewhere take theirs from their own AWS environment."""
    store = ObjectStore.from_settings(settings)
    for key, name in (("accessKeyId", "AWS_ACCESS_KEY_ID"), ("secretAccessKey", "AWS_SECRET_ACCESS_KEY"),
                      ("sessionToken", "AWS_SESSION_TOKEN")):
        value = getattr(store, _FIELDS[key])
        if key in settings.object_store and value:
            os.environ[name] = value
    configure(store)
    return store


_FIELDS = {"endpoint": "endpoint", "region": "region", "accessKeyId": "access_key_id",
           "secretAccessKey": "secret_access_key", "sessionToken": "session_token", "pathStyle": "path_style"}


def configured() -> bool:
    """Whether this process was configured with the daemon's object store (the daemon and the
    CLI are; a Spark worker or a Spark Connect server is not)."""
    return _configured is not None


def current() -> ObjectStore:
    return _configured if _configured is not None else ObjectStore.from_environment()


def at(location: str | os.PathLike[str]) -> Storage:
    """The storage that holds ``location`` (a path, ``file://`` or ``s3://bucket/...``)."""
    location = str(location)
    if not is_object_store(location):
        key = "file"
    else:
        parts = urlsplit(location)
        key = f"{parts.scheme}://{parts.netloc}"
    with _lock:
        found = _storages.get(key)
        if found is None:
            found = _storages[key] = Storage("/" if key == "file" else key, _configured)
        return found


@dataclass
class Storage:
    """One warehouse's files: list, test, delete, sync, by location."""

    warehouse: str
    store: ObjectStore | None = None

    def __post_init__(self):
        self.remote = is_object_store(self.warehouse)
        if self.remote:
            scheme = urlsplit(self.warehouse).scheme
            self.fs = (self.store or ObjectStore.from_environment()).s3() if scheme.startswith("s3") else \
                pafs.FileSystem.from_uri(self.warehouse)[0]
        else:
            self.fs = pafs.LocalFileSystem()

    # -- locations and paths ----------------------------------------------------------------

    def path(self, location: str) -> str:
        """The filesystem's path of a location (``bucket/key`` for an object store)."""
        if self.remote:
            parts = urlsplit(location)
            return f"{parts.netloc}{parts.path}"
        return str(local_path(location))

    def location(self, path: str) -> str:
        if self.remote:
            return f"{urlsplit(self.warehouse).scheme}://{path}"
        return path

    def join(self, location: str, *parts: str) -> str:
        if self.remote:
            return "/".join([location.rstrip("/"), *parts])
        return str(Path(local_path(location), *parts))

    # -- operations ---------------------------------------------------------------------------

    def ensure_bucket(self) -> None:
        """The warehouse's bucket, created when it does not exist yet (a new S3-compatible
        store); where creating buckets is not allowed (AWS with a narrow policy) the refusal
        names the setting."""
        if not self.remote:
            return
        bucket = urlsplit(self.warehouse).netloc
        if self.fs.get_file_info(bucket).type != pafs.FileType.NotFound:
            return
        from reconciler.errors import PermanentError

        try:
            (self.store or current()).s3(allow_bucket_creation=True).create_dir(bucket)
        except OSError as exc:
            raise PermanentError(f"setting segments: the bucket {bucket} does not exist and cannot be created "
                                 f"({unreachable_reason(exc) or exc})") from None
        log.warning("created the bucket %s for the warehouse (it did not exist)", bucket)


    def list(self, location: str) -> dict[str, tuple[float, int]]:
        """Every file under ``location`` (recursively): location -> (mtime, size)."""
        selector = pafs.FileSelector(self.path(location), recursive=True, allow_not_found=True)
        out = {}
        for info in self.fs.get_file_info(selector):
            if info.type == pafs.FileType.File:
                mtime = info.mtime.timestamp() if info.mtime is not None else 0.0
                out[self.location(info.path)] = (mtime, info.size or 0)
        return out

    def dirs(self, location: str) -> list[str]:
        """The directories (prefixes) right under ``location``."""
        selector = pafs.FileSelector(self.path(location), recursive=False, allow_not_found=True)
        return [self.location(i.path) for i in self.fs.get_file_info(selector) if i.type == pafs.FileType.Directory]

    def exists(self, locations: Iterable[str]) -> set[str]:
        locations = list(locations)
        infos = self.fs.get_file_info([self.path(x) for x in locations])
        return {x for x, i in zip(locations, infos, strict=True) if i.type != pafs.FileType.NotFound}

    def delete(self, locations: Iterable[str]) -> None:
        for x in locations:
            try:
                self.fs.delete_file(self.path(x))
            except FileNotFoundError:
                pass

    def delete_dir(self, location: str) -> None:
        try:
            self.fs.delete_dir(self.path(location))
        except FileNotFoundError:
            pass

    def has_any(self, location: str) -> bool:
        """Whether any file lies under ``location`` (a prefix on an object store)."""
        return bool(self.list(location))

    def write_bytes(self, location: str, data: bytes) -> None:
        """One file, whole: a PUT on an object store (atomic: a reader sees all or nothing);
        on local disk through a temporary name and a rename, for the same guarantee."""
        if self.remote:
            with self.fs.open_output_stream(self.path(location)) as out:
                out.write(data)
            return
        path = local_path(location)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)

    def read_bytes(self, location: str) -> bytes:
        """A file's bytes; ``FileNotFoundError`` when it does not exist."""
        with self.fs.open_input_stream(self.path(location)) as f:
            return f.read()

    def output(self, location: str):
        """A stream that writes a new file (a PUT when closed, on an object store)."""
        if not self.remote:
            local_path(location).parent.mkdir(parents=True, exist_ok=True)
        return self.fs.open_output_stream(self.path(location))

    def sync(self, files: Iterable[str], dirs: Iterable[str] = ()) -> None:
        """Durable before a commit points at them: fsync on local disk, nothing to do on an
        object store (a PUT that returned is durable)."""
        if not self.remote:
            durable.sync([local_path(f) for f in files], [local_path(d) for d in dirs])
