"""Which secrets a spec may name: what the operator granted, and nothing else.

A config repo is written by many teams, and the daemon runs with every team's
credentials. A spec may therefore read only what the operator granted:

* ``${file:PATH}``: a regular file under the secrets directory (the ``secretsDir``
  setting; by default ``$CREDENTIALS_DIRECTORY``, where systemd puts the ``LoadCredential=``
  files). PATH is absolute, starts with ``$CREDENTIALS_DIRECTORY/``, or is relative to the
  secrets directory. Links are resolved and the real path must stay inside the real
  secrets directory; the file is opened without following a last link and without
  blocking, checked again after it is open (a FIFO or a device is refused, never waited
  on; a directory swapped for a link in between is caught), and read up to
  ``MAX_SECRET_BYTES``.
* ``${env:NAME}``: only the names listed in ``secretEnv``.
* librdkafka properties that make the client read a file (private keys, keystores,
  keytabs, JWT assertions, and CA and CRL files too) follow the ``${file:}`` rule: a key
  read from another team's path would authenticate as that team, and librdkafka opens
  these files while it builds a client holding Python's lock, so a FIFO there would freeze
  the whole daemon, not one step. ``ssl.ca.location: probe`` (the system's CAs) stays
  allowed. Properties that run a command, load a library or write files are refused outright.

* per spec (``secretGrants``): which specs may use which of those secrets. A key names
  secrets (``file:GLOB``, a path under the secrets directory, or ``env:GLOB``; a bare GLOB is
  ``file:``), its value the ids of the specs that may use them (ids or id globs, comma-
  separated: ``team-b-*``; a selector must match both the spec's id and its file's name,
  and a file is matched by its real path, links resolved). The directory and the variables
  are the daemon's, shared by every team; without a per-spec grant, Team A's ``client.id: ${file:team-b-password}``
  sent Team B's password to a broker Team A chose. Once ``secretGrants`` names anything,
  every secret a spec uses must be granted to it there (strict). Left empty, the old form
  stands: every spec may use every secret of the directory and the variables, and a
  warning says so once per process (deprecated: it will become strict).

``check_file``, ``check_env`` and ``check_property`` say why a spec's reference is
refused (validation names file:line, and every pass checks again, so a grant withdrawn by
SIGHUP counts at once); ``read_file`` and ``read_env`` hold to the same rules when a client
is built.

Spark's Python workers build clients too, in processes started by the daemon's JVM: so
``grant`` also exports the grants (``RECONCILER_SECRETS_DIR``, ``RECONCILER_SECRET_ENV``) to
the environment those processes inherit (Spark is started after the settings are read), and
a process that was never told reads them from there. The daemon's own checks run before
every batch whatever the workers were told.
"""

from __future__ import annotations

import logging
import os
import re
import stat
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase

from reconciler.errors import PermanentError

ENV_DIR = "RECONCILER_SECRETS_DIR"
ENV_NAMES = "RECONCILER_SECRET_ENV"
MAX_SECRET_BYTES = 64 << 10  # a password, a key or a keystore; not a data file
MAX_CLIENT_FILE_BYTES = 4 << 20  # a file the client reads itself: a CA bundle may hold a few hundred certificates
HOW_DIR = "secretsDir, --secrets-dir, RECONCILER_SECRETS_DIR; under systemd LoadCredential= sets it"
HOW_ENV = "secretEnv, --secret-env, RECONCILER_SECRET_ENV"
HOW_SPECS = "secretGrants, --secret-grants, RECONCILER_SECRET_GRANTS"
_SELECTOR = re.compile(r"^[a-z0-9*?\[\]_-]{1,63}$")  # an id (schema: ^[a-z0-9][a-z0-9_-]{0,62}$) or a glob of ids
log = logging.getLogger(__name__)
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_CREDENTIALS = "$CREDENTIALS_DIRECTORY"

# librdkafka's CONFIGURATION.md: properties whose value is a path the client reads.
FILE_PROPERTIES = frozenset({
    "ssl.key.location", "ssl.keystore.location", "ssl.certificate.location", "sasl.kerberos.keytab",
    "sasl.oauthbearer.assertion.private.key.file", "sasl.oauthbearer.assertion.file",
    "sasl.oauthbearer.assertion.jwt.template.file", "ssl.ca.location", "https.ca.location", "ssl.crl.location",
})
_SPECIAL_VALUES = {("ssl.ca.location", "probe")}  # not a path: librdkafka probes the system's CA paths
# ... and properties no spec may set: whoever writes one runs code as the daemon or writes its files.
REFUSED_PROPERTIES = {
    "sasl.kerberos.kinit.cmd": "runs a shell command",
    "plugin.library.paths": "loads a shared library into the daemon",
    "ssl.engine.location": "loads an OpenSSL engine into the daemon",
    "offset.store.path": "writes files outside the state directory",
}


def reads_file(key: str, value: object) -> bool:
    """Whether a librdkafka property with this value makes the client read a file."""
    name = key.strip().lower()
    return name in FILE_PROPERTIES and isinstance(value, str) and (name, value.strip()) not in _SPECIAL_VALUES


@dataclass(frozen=True)
class Grants:
    """The secrets directory (absolute, or None) and the environment variables specs may read."""

    secrets_dir: str | None = None
    env: frozenset[str] = frozenset()
    # secretGrants: ((kind, secret glob), spec id globs); empty: every spec may use every secret (old form)
    per_spec: tuple[tuple[tuple[str, str], tuple[str, ...]], ...] = ()

    @classmethod
    def of(cls, secrets_dir: str | None, names: str | Iterable[str] | None,
           per_spec: str | Mapping[str, str | Iterable[str]] | None = None) -> Grants:
        """From the settings' values: ``names`` is a comma-separated string or a list;
        ``per_spec`` maps ``[file:|env:]GLOB`` to spec ids or id globs (comma-separated or a list)."""
        if isinstance(names, str):
            names = names.split(",")
        listed = frozenset(str(n).strip() for n in (names or ()) if str(n).strip())
        bad = sorted(n for n in listed if not ENV_NAME.match(n))
        if bad:
            raise PermanentError(f"setting secretEnv: {', '.join(map(repr, bad))} is not an environment "
                                 "variable name (letters, digits and _, comma-separated)")
        return cls(os.path.abspath(secrets_dir) if secrets_dir else None, listed, _per_spec(per_spec or {}))

    @classmethod
    def from_settings(cls, settings) -> Grants:
        """From ``reconciler.settings.Settings`` (``secretsDir`` already defaulted)."""
        granted = cls.of(settings.secrets_dir or None, settings.secret_env, getattr(settings, "secret_grants", None))
        if granted.given and not granted.per_spec:
            _warn_shared()
        return granted

    @classmethod
    def from_environment(cls, env: dict[str, str] | None = None) -> Grants:
        env = os.environ if env is None else env
        return cls.of(env.get(ENV_DIR) or env.get("CREDENTIALS_DIRECTORY") or None, env.get(ENV_NAMES, ""))

    @property
    def given(self) -> bool:
        """Whether anything is granted: ``validate`` checks grants only then."""
        return bool(self.secrets_dir or self.env or self.per_spec)

    def spec_may_use(self, spec_id: object, stem: str, kind: str, name: str) -> str | None:
        """Why spec ``spec_id``, read from a file named ``stem`` (``file_stem``), may not use
        secret ``name`` (``kind`` file: its real path under the secrets directory; env: the
        variable), or None. A grant's spec selector must match both the id and the file's name:
        the id is whatever the file declares, while a config repo's owners rules (CODEOWNERS)
        follow paths. Without ``secretGrants`` every spec may."""
        if not self.per_spec:
            return None
        sid = str(spec_id) if isinstance(spec_id, str) else ""
        for selectors in self._selectors(kind, name):
            if sid and any(fnmatchcase(sid, s) and fnmatchcase(stem, s) for s in selectors):
                return None
        what = f"file {name} of the secrets directory" if kind == "file" else f"environment variable {name}"
        whose = f"spec {sid or '(no id)'}"
        if stem != sid:
            whose += f" of file {stem}.yaml (a grant must match both the spec's id and its file's name)"
        return (f"uses {what}, which is not granted to {whose}: the operator grants it with "
                f"{HOW_SPECS} ({kind}:{name}: {sid or 'ID'})")

    def _selectors(self, kind: str, name: str) -> list[tuple[str, ...]]:
        return [selectors for (k, pattern), selectors in self.per_spec if k == kind and fnmatchcase(name, pattern)]

    def file_name(self, path: str) -> str:
        """A file's name as ``secretGrants`` matches it: its real path (links resolved) under
        the real secrets directory. A link's own name is chosen by whoever may write where it
        lies; what is read is its target."""
        if not self.secrets_dir:
            return path
        return os.path.relpath(os.path.realpath(path), os.path.realpath(self.secrets_dir))

    def link_refusal(self, path: str) -> str | None:
        """Why a file argument whose path (``path``, links not resolved) leads through a link
        may not be read for whoever its name is granted to, or None: with ``secretGrants``,
        its target must be granted to every spec its name is (``team-a/stolen`` ->
        ``../team-b/kafka-password`` is not). Checked where no spec is known: a client build."""
        if not self.per_spec or not self.secrets_dir:
            return None
        name, target = os.path.relpath(path, self.secrets_dir), self.file_name(path)
        if name == target:
            return None
        have = [s for selectors in self._selectors("file", target) for s in selectors]
        need = [s for selectors in self._selectors("file", name) for s in selectors]
        if all(any(_covers(t, s) for t in have) for s in need):
            return None
        return (f"resolves through a link to {target} of the secrets directory, which is not granted to every "
                f"spec {name} is granted to ({HOW_SPECS})")


def _covers(wide: str, narrow: str) -> bool:
    """Whether every id the selector ``narrow`` matches is matched by ``wide`` (sure only for
    an id, ``*`` and a literal prefix followed by ``*``; anything else is not covered)."""
    if wide in (narrow, "*"):
        return True
    literal = re.split(r"[*?\[]", narrow, maxsplit=1)[0]
    if literal == narrow:
        return fnmatchcase(narrow, wide)
    prefix = wide[:-1]
    return wide.endswith("*") and not re.search(r"[*?\[]", prefix) and literal.startswith(prefix)


def _per_spec(value: str | Mapping[str, str | Iterable[str]]) -> tuple[tuple[tuple[str, str], tuple[str, ...]], ...]:
    if isinstance(value, str):  # the setting: SECRET=SPECS;SECRET=SPECS
        pairs = [item.partition("=") for item in value.split(";") if item.strip()]
        bad = [n for n, (k, sep, _) in enumerate(pairs, 1) if not sep or not k.strip()]
        if bad:
            raise PermanentError(f"setting secretGrants: entry {bad[0]} is not SECRET=SPECS, e.g. "
                                 "team-b-*=team-b-*;env:TEAM_A_TOKEN=team-a-clicks")
        value = {k: v for k, _, v in pairs}
    out = []
    for key, selectors in value.items():
        kind, sep, pattern = str(key).strip().partition(":")
        if not sep:
            kind, pattern = "file", str(key).strip()
        pattern = os.path.normpath(pattern) if kind == "file" and pattern else pattern
        if kind not in ("file", "env") or not pattern or pattern.startswith(("/", "..")):
            raise PermanentError(f"setting secretGrants: {str(key)!r} does not name secrets: use file:GLOB (a path "
                                 "under secretsDir) or env:GLOB (a variable of secretEnv); a bare GLOB is file:")
        items = selectors.split(",") if isinstance(selectors, str) else list(selectors or ())
        specs = tuple(str(x).strip() for x in items if str(x).strip())
        wrong = [x for x in specs if not _SELECTOR.match(x)]
        if wrong or not specs:
            raise PermanentError(f"setting secretGrants: {key}: {', '.join(map(repr, wrong)) or 'nothing'} does not "
                                 "name specs: give spec ids or id globs, comma-separated (e.g. team-b-*); specs "
                                 "are read from the spec directory's top level only, so there are no subdirectories")
        out.append(((kind, pattern), specs))
    return tuple(out)


_warned = False


def _warn_shared() -> None:
    global _warned
    if not _warned:
        _warned = True
        log.warning("secrets are granted to the daemon, not per spec: every spec may use every file of secretsDir "
                    "and every variable of secretEnv (deprecated); grant them per spec with %s", HOW_SPECS)


_lock = threading.Lock()
_granted: Grants | None = None


def grant(grants: Grants, *, export: bool = True) -> None:
    """What this process (and, with ``export``, every process it starts later) may resolve."""
    global _granted
    with _lock:
        _granted = grants
    if export:
        os.environ[ENV_DIR] = grants.secrets_dir or ""
        os.environ[ENV_NAMES] = ",".join(sorted(grants.env))


def executor_env(grants: Grants) -> dict[str, str]:
    """Spark settings that hand the grants to the executors' Python workers, which resolve
    references when they build their clients (on a cluster they are not this process's children)."""
    return {f"spark.executorEnv.{ENV_DIR}": grants.secrets_dir or "",
            f"spark.executorEnv.{ENV_NAMES}": ",".join(sorted(grants.env))}


def current() -> Grants:
    """This process's grants: as ``grant`` set them, else from the environment."""
    with _lock:
        if _granted is not None:
            return _granted
    return Grants.from_environment()


# --------------------------------------------------------------------------- checks


def _inside(path: str, base: str) -> bool:
    return path == base or path.startswith(base.rstrip(os.sep) + os.sep)


def _target(arg: str, grants: Grants) -> tuple[str | None, str | None]:
    """(the absolute path a ``${file:}`` argument names, or the reason it names none)."""
    if "\0" in arg:
        return None, "holds a NUL byte"
    if not grants.secrets_dir:
        return None, f"reads a file, and no secrets directory is granted ({HOW_DIR})"
    text = arg
    if text == _CREDENTIALS or text.startswith(_CREDENTIALS + "/"):
        credentials = os.environ.get("CREDENTIALS_DIRECTORY")
        if not credentials:
            return None, "names $CREDENTIALS_DIRECTORY, which is not set (systemd sets it with LoadCredential=)"
        text = credentials + text[len(_CREDENTIALS):]
    base = grants.secrets_dir
    path = os.path.normpath(os.path.join(base, text))  # an absolute text replaces the base
    if not _inside(path, base):
        return None, f"names {path}, outside the secrets directory {base} ({HOW_DIR}): only files there may be read"
    return path, None


def check_file(arg: str, grants: Grants, max_bytes: int = MAX_SECRET_BYTES) -> str | None:
    """Why ``${file:arg}`` cannot be read under ``grants``, or None. Looks at the file
    (never opens it)."""
    path, why = _target(arg, grants)
    if why:
        return why
    base = os.path.realpath(grants.secrets_dir)
    if not os.path.isdir(base):
        return f"the secrets directory {grants.secrets_dir} does not exist ({HOW_DIR})"
    real = os.path.realpath(path)
    if not _inside(real, base):
        return f"resolves through a link to {real}, outside the secrets directory {grants.secrets_dir}"
    if why := grants.link_refusal(path):
        return why
    try:
        st = os.stat(real)
    except OSError as exc:
        return f"cannot be read: {path}: {exc.strerror}"
    if not stat.S_ISREG(st.st_mode):
        return f"names {path}, which is not a regular file (a FIFO, device, socket or directory)"
    if st.st_size > max_bytes:
        return f"names {path}, which holds {st.st_size} bytes; a secret file holds at most {max_bytes} bytes"
    return None


def check_env(name: str, grants: Grants) -> str | None:
    """Why ``${env:name}`` cannot be read under ``grants``, or None."""
    if name not in grants.env:
        return f"reads environment variable {name}, which is not granted: add it to {HOW_ENV}"
    if name not in os.environ:
        return f"reads environment variable {name}, which is granted but not set"
    return None


def check_property(key: str, value: str, grants: Grants | None) -> str | None:
    """Why a librdkafka property may not have this (literal) value, or None. Without
    ``grants`` only the outright refusals count."""
    name = key.strip().lower()
    if name in REFUSED_PROPERTIES:
        return f"{key} {REFUSED_PROPERTIES[name]}: no spec may set it"
    if reads_file(key, value) and grants is not None:
        why = check_file(value, grants, MAX_CLIENT_FILE_BYTES)
        if why:
            return f"{key} reads a file and {why}"
    return None


# --------------------------------------------------------------------------- reads


def _refused(reference: str, why: str) -> PermanentError:
    return PermanentError(f"secret reference {reference} is refused: it {why}")


def secret_path(arg: str, grants: Grants, reference: str) -> str:
    """The real path a granted file argument names (links resolved, still inside the
    secrets directory); ``PermanentError`` otherwise."""
    path, why = _target(arg, grants)
    if why:
        raise _refused(reference, why)
    base = os.path.realpath(grants.secrets_dir)
    real = os.path.realpath(path)
    if not _inside(real, base):
        raise _refused(reference, f"resolves through a link to {real}, outside the secrets directory")
    if why := grants.link_refusal(path):
        raise _refused(reference, why)
    return real


def client_file(arg: str, grants: Grants, reference: str) -> str:
    """The real path of a granted regular file for a client property to read (looked at,
    never opened: the client opens it, and must never meet a FIFO or a device)."""
    real = secret_path(arg, grants, reference)
    why = check_file(real, grants, MAX_CLIENT_FILE_BYTES)
    if why:
        raise _refused(reference, why)
    return real


def read_file(arg: str, grants: Grants | None = None) -> str:
    """The value of ``${file:arg}``: the file's text without its final line break."""
    grants = grants or current()
    reference = f"${{file:{arg}}}"
    real = secret_path(arg, grants, reference)
    base = os.path.realpath(grants.secrets_dir)
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(real, flags)
    except OSError as exc:
        raise PermanentError(f"secret reference {reference}: cannot read {real}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _refused(reference, f"names {real}, which is not a regular file")
        opened = _opened_path(fd, real)
        if not _inside(opened, base):  # a directory on the way was swapped for a link
            raise _refused(reference, f"opened {opened}, outside the secrets directory")
        if st.st_size > MAX_SECRET_BYTES:
            raise _refused(reference, f"names a file of {st.st_size} bytes; at most {MAX_SECRET_BYTES}")
        data = os.read(fd, MAX_SECRET_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_SECRET_BYTES:  # grew after the check
        raise _refused(reference, f"names a file of more than {MAX_SECRET_BYTES} bytes")
    return data.decode("utf-8", errors="replace").rstrip("\r\n")


def _opened_path(fd: int, fallback: str) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:  # no /proc: the realpath check before the open stands
        return fallback


def read_env(name: str, grants: Grants | None = None) -> str:
    """The value of ``${env:name}``."""
    grants = grants or current()
    if name not in grants.env:
        raise _refused(f"${{env:{name}}}", f"reads environment variable {name}, which is not granted: "
                                           f"add it to {HOW_ENV}")
    if name not in os.environ:
        raise PermanentError(f"secret reference ${{env:{name}}}: environment variable {name} is not set")
    return os.environ[name]
