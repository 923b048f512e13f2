"""The spec directory adapter: files in, desired state and reset requests out.

At the start of every tick the daemon (and ``reconciler validate``/``plan``) calls
``load_directory``: the top level of the watched directory is classified
(specs, markers, ignored), every spec is parsed (``yamlsafe``), validated
(``validate``) and typed (``SupervisorSpec``), every marker likewise
(``Marker``), and the result is one frozen ``DirectoryState``.

Unreadable is never absent: a directory that cannot be read is ``ok=False``
(the planner then plans nothing destructive), and a file that does not parse or
validate stays in ``invalid`` with the supervisor id recovered as well as
possible, so its supervisor keeps its last good spec instead of being removed.
Paths in messages are shown as the caller spelled the directory. A directory or
file that others could have written is refused (``permissions``) unless the
``allowInsecureSpecs`` setting says otherwise.

The daemon passes its ``SpecCache`` so that spec files unchanged since the last pass
are not read, parsed or validated again (``filecache``); permissions and duplicate ids
are still judged on every pass. Markers are always read: a marker that is a directory,
and every one of two or more valid markers for one supervisor in the same pass
(``a.reset.yaml`` beside ``a.reset.yml``), is rejected with the reason, never applied.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from types import MappingProxyType
from typing import Literal

from reconciler.errors import SpecInvalid, SpecProblem
from reconciler.model import (
    MARKER_SUFFIXES,
    SPEC_SUFFIXES,
    Marker,
    Position,
    SupervisorSpec,
    file_stem,
)
from reconciler.spec import permissions, secrets
from reconciler.spec.filecache import FileCache, FileKey
from reconciler.spec.validate import load_schema, sort_problems, validate_document
from reconciler.spec.yamlsafe import ParsedYaml, format_field, parse_yaml, read_limited

FileKind = Literal["spec", "marker", "ignored"]

_ID_LINE = re.compile(r"""^id:[ \t]*["']?([^"'\s#]+)""", re.MULTILINE)


@dataclass(frozen=True)
class DirectoryState:
    """Everything the spec directory says at one moment, keyed by the paths shown to people."""

    path: str
    ok: bool
    error: str | None = None
    specs: Mapping[str, SupervisorSpec] = field(default_factory=dict)
    invalid: Mapping[str, SpecInvalid] = field(default_factory=dict)
    invalid_ids: Mapping[str, str] = field(default_factory=dict)  # recovered id -> path
    markers: tuple[Marker, ...] = ()
    rejected_markers: Mapping[str, SpecInvalid] = field(default_factory=dict)
    warnings: tuple[SpecProblem, ...] = ()

    def by_id(self) -> dict[str, SupervisorSpec]:
        """The valid specs by supervisor id (ids are unique among them)."""
        return {spec.id: spec for spec in self.specs.values()}

    @property
    def problems(self) -> list[SpecProblem]:
        """Every problem of every invalid spec and rejected marker, by file then line."""
        found = [
            p for e in (*self.invalid.values(), *self.rejected_markers.values()) for p in e.problems
        ]
        return sorted(found, key=lambda p: (p.path, p.line or 0, p.column or 0))


def classify(path: str | os.PathLike[str]) -> FileKind:
    """What a name in the watched directory is: ``spec``, ``marker`` or ``ignored``.

    Decided by the name alone: dotfiles (``.git``, ``.foo.swp``, ``.#foo.yaml``),
    editor backups (``foo.yaml~``, ``#foo.yaml#``), results (``.applied``,
    ``.rejected``) and anything not ending in ``.yaml``/``.yml`` are ignored.
    """
    name = os.path.basename(os.fspath(path).rstrip("/\\"))
    if not name or name.startswith((".", "#")) or name.endswith(("~", "#")):
        return "ignored"
    lower = name.lower()
    if lower.endswith(MARKER_SUFFIXES):
        return "marker"
    if lower.endswith(SPEC_SUFFIXES):
        return "spec"
    return "ignored"


def marker_supervisor_id(path: str | os.PathLike[str]) -> str:
    """``clicks.reset.yaml`` -> ``clicks``."""
    name = os.path.basename(os.fspath(path))
    if name.lower().endswith(MARKER_SUFFIXES):
        return file_stem(name)
    raise ValueError(f"not a marker file name: {name} (expected <id>.reset.yaml)")


def load_spec_file(
    path: str | os.PathLike[str],
    *,
    root: str | os.PathLike[str] | None = None,
    now: datetime | None = None,
) -> SupervisorSpec:
    """One spec file as a ``SupervisorSpec``; ``SpecInvalid`` lists all its problems.

    ``root`` is the spec directory (default: the file's directory); a symlink that
    resolves outside it is an error.
    """
    result = _load_spec(os.fspath(path), root, now)
    if result.problems:
        raise SpecInvalid(result.problems)
    assert result.spec is not None
    return result.spec


def spec_warnings(path: str | os.PathLike[str], spec: SupervisorSpec) -> list[SpecProblem]:
    """Advice that does not invalidate a spec: the file name differs from ``specs/<id>.yaml``;
    a secret is written out instead of referenced."""
    shown = os.fspath(path)
    name = os.path.basename(shown)
    stem = name.rsplit(".", 1)[0]
    out = [
        SpecProblem(
            shown,
            None,
            None,
            format_field(at),
            f"{what} is a literal secret: it is kept in the database's spec history; "
            "write it as ${env:NAME} or ${file:/path}",
        )
        for at, what in secrets.literal_secrets(spec.document.get("source") or {})
    ]
    if stem != spec.id:
        out.insert(
            0,
            SpecProblem(
                shown,
                None,
                None,
                "id",
                f"id '{spec.id}' differs from the file name; by convention the file is {spec.id}.yaml",
            ),
        )
    return out


def load_marker_file(
    path: str | os.PathLike[str],
    known_ids: Iterable[str] | None = None,
    *,
    root: str | os.PathLike[str] | None = None,
    now: datetime | None = None,
) -> Marker:
    """One ``<id>.reset.yaml`` marker; an empty file means ``resetTo: latest`` with backfill.

    The supervisor id comes from the file name. With ``known_ids``, a marker for any
    other id is rejected. ``token`` is sha256 of the file's name in the directory,
    a NUL byte and the file's bytes: the same request dropped twice is one request.
    """
    display = os.fspath(path)
    try:
        sid = marker_supervisor_id(display)
    except ValueError as exc:
        raise SpecInvalid([SpecProblem(display, None, None, "", str(exc))]) from None
    data = _read(display, root)
    problems: list[SpecProblem] = []
    if not re.search(load_schema("spec")["properties"]["id"]["pattern"], sid):
        problems.append(
            SpecProblem(
                display,
                None,
                None,
                "",
                f"'{sid}' is not a supervisor id; markers are "
                "named <id>.reset.yaml with a lowercase id",
            )
        )
    elif known_ids is not None and sid not in set(known_ids):
        known = ", ".join(sorted(set(known_ids))) or "none"
        problems.append(
            SpecProblem(display, None, None, "", f"unknown supervisor '{sid}' (known: {known})")
        )
    try:
        parsed = parse_yaml(data, display, allow_empty=True)
    except SpecInvalid as exc:
        raise SpecInvalid(sort_problems([*problems, *exc.problems])) from None
    problems += validate_document(parsed, "marker", now=now)
    if problems:
        raise SpecInvalid(sort_problems(problems))
    doc = parsed.data
    name = os.path.basename(display)
    try:  # this appearance of the file (see Marker.appearance): the same bytes dropped again are a new request
        st = os.lstat(display)
        appearance = f"{st.st_dev}:{st.st_ino}:{st.st_ctime_ns}"
    except OSError:
        appearance = ""
    return Marker(
        supervisor_id=sid,
        path=display,
        token=hashlib.sha256(name.encode() + b"\0" + data).hexdigest(),
        appearance=appearance,
        reset_to=Position.from_document(doc.get("resetTo", "latest")),
        backfill=bool(doc.get("backfill", True)),
        backfill_task_count=doc.get("backfillTaskCount"),
        allow_rewind=bool(doc.get("allowRewind", False)),
        reason=doc.get("reason"),
    )


def load_directory(
    directory: str | os.PathLike[str],
    *,
    now: datetime | None = None,
    check_permissions: bool = True,
    cache: SpecCache | None = None,
    progress: Callable[[], object] | None = None,
) -> DirectoryState:
    """The whole top level of the spec directory, never raising for a bad file.

    With ``check_permissions`` (the default; off with the ``allowInsecureSpecs``
    setting) a directory writable by others is ``ok=False`` and such files are
    invalid or rejected (see ``permissions``). With ``cache`` (the daemon's, kept
    across passes) a spec file that did not change since it was last loaded is not
    read, parsed or validated again (see ``filecache``); markers always are.
    ``progress`` is called before each spec file (the daemon renews its leader lease there
    when due: a first pass over ten thousand files outlasts the lease's TTL).
    """
    shown = os.fspath(directory)
    try:
        entries = sorted(os.scandir(shown), key=lambda e: e.name)
    except FileNotFoundError:
        return DirectoryState(path=shown, ok=False, error=f"spec directory {shown} does not exist")
    except NotADirectoryError:
        return DirectoryState(
            path=shown, ok=False, error=f"spec directory {shown} is not a directory"
        )
    except OSError as exc:
        return DirectoryState(
            path=shown,
            ok=False,
            error=f"spec directory {shown} cannot be read: {exc.strerror or exc}",
        )
    if check_permissions:
        refused = permissions.insecure_reason(shown)
        if refused:
            return DirectoryState(path=shown, ok=False, error=refused)
    if cache is not None:
        cache.begin()
    results: list[_SpecResult] = []
    marker_entries: list[os.DirEntry[str]] = []
    for entry in entries:
        kind = classify(entry.name)
        if kind == "spec" and not _is_dir(entry):
            if progress is not None:
                progress()
            results.append(_spec_result(entry, shown, now, check_permissions, cache))
        elif kind == "marker":
            marker_entries.append(entry)
    if cache is not None:
        cache.retain(r.path for r in results)
    _flag_duplicate_ids(results)
    id_pattern = re.compile(load_schema("spec")["properties"]["id"]["pattern"])
    known = {r.id for r in results if r.id and id_pattern.search(r.id)}  # '../x' names no marker
    markers, rejected = _load_markers(marker_entries, shown, known, now, check_permissions)
    return _directory_state(shown, results, markers, rejected)


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir()
    except OSError:
        return False  # reading it reports why


def _directory_state(
    shown: str, results: list[_SpecResult], markers: list[Marker], rejected: dict[str, SpecInvalid]
) -> DirectoryState:
    specs = {r.path: r.spec for r in results if r.spec is not None and not r.problems}
    invalid = {r.path: SpecInvalid(r.problems) for r in results if r.problems}
    invalid_ids: dict[str, str] = {}
    for r in results:
        if r.problems:
            invalid_ids.setdefault(r.id or file_stem(r.path), r.path)
    warnings = tuple(w for r in results if not r.problems and r.spec for w in r.warnings)
    return DirectoryState(
        path=shown,
        ok=True,
        specs=MappingProxyType(specs),
        invalid=MappingProxyType(invalid),
        invalid_ids=MappingProxyType(invalid_ids),
        markers=tuple(markers),
        rejected_markers=MappingProxyType(rejected),
        warnings=warnings,
    )


def _load_markers(
    entries: list[os.DirEntry[str]],
    shown: str,
    known: set[str],
    now: datetime | None,
    check_permissions: bool,
) -> tuple[list[Marker], dict[str, SpecInvalid]]:
    markers: list[Marker] = []
    rejected: dict[str, SpecInvalid] = {}
    for entry in entries:
        full = os.path.join(shown, entry.name)
        try:
            if _is_dir(entry):
                raise SpecInvalid([SpecProblem(full, None, None, "", _MARKER_IS_DIRECTORY)])
            refused = permissions.insecure_reason(full) if check_permissions else None
            if refused:
                raise SpecInvalid([SpecProblem(full, None, None, "", refused)])
            markers.append(load_marker_file(full, known, root=shown, now=now))
        except SpecInvalid as exc:
            rejected[full] = exc
    return _reject_ambiguous(markers, rejected)


_MARKER_IS_DIRECTORY = (
    "is a directory: a marker must be a regular file (<id>.reset.yaml); renamed .rejected"
)


def _reject_ambiguous(
    markers: list[Marker], rejected: dict[str, SpecInvalid]
) -> tuple[list[Marker], dict[str, SpecInvalid]]:
    """Two valid markers for one supervisor in one pass (``a.reset.yaml`` and ``a.reset.yml``)
    are two requests of which the operator meant at most one, and applying both in file-name
    order would make the second undo or repeat the first: none is applied, each is rejected
    with a reason naming the others, and the operator drops the intended one again."""
    by_id: dict[str, list[Marker]] = {}
    for m in markers:
        by_id.setdefault(m.supervisor_id, []).append(m)
    kept: list[Marker] = []
    for m in markers:
        group = by_id[m.supervisor_id]
        if len(group) == 1:
            kept.append(m)
            continue
        others = ", ".join(os.path.basename(o.path) for o in group if o is not m)
        message = (
            f"ambiguous: {len(group)} markers for supervisor '{m.supervisor_id}' in one pass "
            f"(also {others}); none is applied: drop again only the one you mean"
        )
        rejected[m.path] = SpecInvalid([SpecProblem(m.path, None, None, "", message)])
    return kept, rejected


@dataclass
class _SpecResult:
    """One spec file's outcome; once cached it is shared by later passes and never changed."""

    path: str
    spec: SupervisorSpec | None = None
    problems: list[SpecProblem] = field(default_factory=list)
    id: str | None = None  # as declared, or recovered from a broken file
    id_from_document: bool = False  # the id came from a parsed mapping (reliable)
    id_line: tuple[int | None, int | None] = (None, None)
    warnings: tuple[SpecProblem, ...] = ()
    parsed: ParsedYaml | None = None  # kept while validation fails: validated again each pass


SpecCache = FileCache[_SpecResult]


def _spec_result(
    entry: os.DirEntry[str],
    shown: str,
    now: datetime | None,
    check_permissions: bool,
    cache: SpecCache | None,
) -> _SpecResult:
    """One spec file: from the cache when unchanged, else loaded (and cached)."""
    full = os.path.join(shown, entry.name)
    read_at = time.time_ns()
    try:
        st = os.stat(full)
    except OSError:
        return _load_spec(full, shown, now)  # dangling symlink, vanished: reading reports why
    if check_permissions:
        refused = permissions.describe_mode(full, st.st_mode, st.st_gid)
        if refused:  # never trusted, cached or not; its id is still recovered
            result = _load_spec(full, shown, now)
            result.problems, result.spec = [SpecProblem(full, None, None, "", refused)], None
            return result
    if cache is None:
        return _load_spec(full, shown, now)
    key = FileKey.of(st, os.path.realpath(full) if entry.is_symlink() else None)
    cached = cache.lookup(full, key, lambda: _read_or_none(full, shown))
    if cached is not None:
        return _revalidated(cached, now) if cached.parsed is not None else cached
    data: list[bytes] = []
    result = _load_spec(full, shown, now, data)
    cache.store(full, key, data[0] if data else b"", read_at, result)
    return result


def _revalidated(cached: _SpecResult, now: datetime | None) -> _SpecResult:
    """A cached file that failed validation is validated again (not parsed): a timestamp in
    the future becomes valid once its time has come."""
    assert cached.parsed is not None
    result = _SpecResult(path=cached.path)
    _finish(result, cached.parsed, now)
    return result


def _read_or_none(display: str, root: str) -> bytes | None:
    try:
        return _read(display, root)
    except SpecInvalid:
        return None


def _load_spec(
    display: str,
    root: str | os.PathLike[str] | None,
    now: datetime | None,
    data_out: list[bytes] | None = None,
) -> _SpecResult:
    """Read, parse, validate and type one spec file; ``data_out`` receives the bytes read."""
    result = _SpecResult(path=display)
    data = b""
    try:
        data = _read(display, root)
        if data_out is not None:
            data_out.append(data)
        parsed = parse_yaml(data, display)
    except SpecInvalid as exc:
        result.problems = exc.problems
        result.id = _recover_id(data) or file_stem(display)
        return result
    _finish(result, parsed, now)
    return result


def _finish(result: _SpecResult, parsed: ParsedYaml, now: datetime | None) -> None:
    """Validate and type a parsed spec into ``result``."""
    display = result.path
    _note_id(result, parsed)
    result.problems = validate_document(parsed, "spec", now=now)
    if result.problems:
        result.parsed = parsed
    else:
        try:
            result.spec = SupervisorSpec.from_document(parsed.data)
        except (KeyError, TypeError, ValueError) as exc:  # the schema should have caught it
            result.problems = [
                SpecProblem(display, None, None, "", f"cannot build the spec: {exc}")
            ]
    if result.spec is not None and not result.problems:
        result.warnings = tuple(spec_warnings(display, result.spec))


def _note_id(result: _SpecResult, parsed: ParsedYaml) -> None:
    value = parsed.data.get("id")
    if isinstance(value, str) and value:
        result.id, result.id_from_document = value, True
        result.id_line = parsed.key_position(("id",))
    else:
        result.id = file_stem(result.path)


def _flag_duplicate_ids(results: list[_SpecResult]) -> None:
    """Every file declaring an id that another file also declares becomes invalid.

    Results may be the cache's: each flagged one is replaced in ``results`` by a copy."""
    by_id: dict[str, list[int]] = {}
    for i, r in enumerate(results):
        if r.id_from_document and r.id:
            by_id.setdefault(r.id, []).append(i)
    for sid, group in by_id.items():
        if len(group) < 2:
            continue
        for i in group:
            r = results[i]
            others = ", ".join(results[o].path for o in group if o != i)
            problem = SpecProblem(
                r.path, r.id_line[0], r.id_line[1], "id", f"id '{sid}' is also declared in {others}"
            )
            results[i] = replace(r, problems=sort_problems([*r.problems, problem]), spec=None)


def _read(display: str, root: str | os.PathLike[str] | None) -> bytes:
    base = os.path.realpath(root if root is not None else (os.path.dirname(display) or "."))
    if os.path.islink(display):
        target = os.path.realpath(display)
        if os.path.commonpath([base, target]) != base:
            raise SpecInvalid(
                [
                    SpecProblem(
                        display,
                        None,
                        None,
                        "",
                        f"symlink leaves the spec directory (points to {target})",
                    )
                ]
            )
        if not os.path.exists(target):
            raise SpecInvalid(
                [SpecProblem(display, None, None, "", "symlink points to a missing file")]
            )
    return read_limited(display, display)


def _recover_id(data: bytes) -> str | None:
    match = _ID_LINE.search(data.decode("utf-8", errors="replace")) if data else None
    return match.group(1) if match else None
