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
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType
from typing import Literal

from reconciler.errors import SpecInvalid, SpecProblem
from reconciler.spec import permissions, secrets
from reconciler.spec.model import Marker, Position, SupervisorSpec
from reconciler.spec.validate import load_schema, sort_problems, validate_document
from reconciler.spec.yamlsafe import ParsedYaml, format_field, parse_yaml, read_limited

FileKind = Literal["spec", "marker", "ignored"]

MARKER_SUFFIXES = (".reset.yaml", ".reset.yml")
SPEC_SUFFIXES = (".yaml", ".yml")
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
    for suffix in MARKER_SUFFIXES:
        if name.lower().endswith(suffix):
            return name[: -len(suffix)]
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
) -> DirectoryState:
    """The whole top level of the spec directory, never raising for a bad file.

    With ``check_permissions`` (the default; off with the ``allowInsecureSpecs``
    setting) a directory writable by others is ``ok=False`` and such files are
    invalid or rejected (see ``permissions``).
    """
    shown = os.fspath(directory)
    try:
        names = sorted(entry.name for entry in os.scandir(shown))
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
    results: list[_SpecResult] = []
    marker_paths: list[str] = []
    for name in names:
        kind = classify(name)
        full = os.path.join(shown, name)
        if kind == "ignored" or os.path.isdir(full):
            continue
        if kind == "spec":
            result = _load_spec(full, shown, now)
            if check_permissions:
                _refuse_insecure(result)
            results.append(result)
        else:
            marker_paths.append(full)
    _flag_duplicate_ids(results)
    id_pattern = re.compile(load_schema("spec")["properties"]["id"]["pattern"])
    known = {r.id for r in results if r.id and id_pattern.search(r.id)}  # '../x' names no marker
    markers: list[Marker] = []
    rejected: dict[str, SpecInvalid] = {}
    for full in marker_paths:
        refused = permissions.insecure_reason(full) if check_permissions else None
        try:
            if refused:
                raise SpecInvalid([SpecProblem(full, None, None, "", refused)])
            markers.append(load_marker_file(full, known, root=shown, now=now))
        except SpecInvalid as exc:
            rejected[full] = exc
    specs = {r.path: r.spec for r in results if r.spec is not None and not r.problems}
    invalid = {r.path: SpecInvalid(r.problems) for r in results if r.problems}
    invalid_ids: dict[str, str] = {}
    for r in results:
        if r.problems:
            invalid_ids.setdefault(r.id or _stem(r.path), r.path)
    warnings = tuple(
        w for r in results if not r.problems and r.spec for w in spec_warnings(r.path, r.spec)
    )
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


@dataclass
class _SpecResult:
    path: str
    spec: SupervisorSpec | None = None
    problems: list[SpecProblem] = field(default_factory=list)
    id: str | None = None  # as declared, or recovered from a broken file
    id_from_document: bool = False  # the id came from a parsed mapping (reliable)
    id_line: tuple[int | None, int | None] = (None, None)


def _load_spec(
    display: str, root: str | os.PathLike[str] | None, now: datetime | None
) -> _SpecResult:
    result = _SpecResult(path=display)
    data = b""
    try:
        data = _read(display, root)
        parsed = parse_yaml(data, display)
    except SpecInvalid as exc:
        result.problems = exc.problems
        result.id = _recover_id(data) or _stem(display)
        return result
    _note_id(result, parsed)
    result.problems = validate_document(parsed, "spec", now=now)
    if not result.problems:
        try:
            result.spec = SupervisorSpec.from_document(parsed.data)
        except (KeyError, TypeError, ValueError) as exc:  # the schema should have caught it
            result.problems = [
                SpecProblem(display, None, None, "", f"cannot build the spec: {exc}")
            ]
    return result


def _refuse_insecure(result: _SpecResult) -> None:
    """A spec file others could have written is invalid (its id is still recovered)."""
    refused = permissions.insecure_reason(result.path)
    if refused:
        result.problems = [SpecProblem(result.path, None, None, "", refused)]
        result.spec = None


def _note_id(result: _SpecResult, parsed: ParsedYaml) -> None:
    value = parsed.data.get("id")
    if isinstance(value, str) and value:
        result.id, result.id_from_document = value, True
        result.id_line = parsed.key_position(("id",))
    else:
        result.id = _stem(result.path)


def _flag_duplicate_ids(results: list[_SpecResult]) -> None:
    """Every file declaring an id that another file also declares becomes invalid."""
    by_id: dict[str, list[_SpecResult]] = {}
    for r in results:
        if r.id_from_document and r.id:
            by_id.setdefault(r.id, []).append(r)
    for sid, group in by_id.items():
        if len(group) < 2:
            continue
        for r in group:
            others = ", ".join(o.path for o in group if o is not r)
            problem = SpecProblem(
                r.path, r.id_line[0], r.id_line[1], "id", f"id '{sid}' is also declared in {others}"
            )
            r.problems = sort_problems([*r.problems, problem])
            r.spec = None


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


def _stem(path: str) -> str:
    name = os.path.basename(path)
    for suffix in (*MARKER_SUFFIXES, *SPEC_SUFFIXES):
        if name.lower().endswith(suffix):
            return name[: -len(suffix)]
    return name
