"""The spec directory adapter: files in, desired state and reset requests out.

At the start of every tick the daemon (and ``reconciler validate``/``plan``) calls
``load_directory``: the top level of the watched directory is classified (``names``),
every spec is parsed, validated and typed (``specfiles``), every marker likewise
(``markers``), the rules that need the operator's grants (``references``) or compare
files (duplicate ids, ``crossfile``) are applied, and the result is one frozen
``DirectoryState``. ``load_files`` does the same for files named on the command line:
the files of one directory are checked together, as the daemon would check them.

Unreadable is never absent: a directory that cannot be read is ``ok=False`` (the planner
then plans nothing destructive), and a file that does not parse or validate stays in
``invalid`` with the supervisor id recovered as well as possible, so its supervisor keeps
its last good spec instead of being removed. Paths in messages are shown as the caller
spelled the directory; a name that is not valid UTF-8 is shown escaped and never stored
(a marker named that way is in ``bad_markers``: the pass renames it ``.rejected``). A
directory or file that others could have written is refused (``permissions``) unless the
``allowInsecureSpecs`` setting says otherwise.

The daemon passes its ``SpecCache`` so that spec files unchanged since the last pass are
not read, parsed or validated again (``filecache``); permissions, grants, duplicate ids and
the cross-file rules are still judged on every pass.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from types import MappingProxyType

from reconciler.errors import SpecInvalid, SpecProblem
from reconciler.model import Marker, SupervisorSpec, file_stem
from reconciler.spec import crossfile, permissions, references
from reconciler.spec.grants import Grants
from reconciler.spec.markers import load_marker_file, load_markers
from reconciler.spec.names import BAD_NAME, FileKind, classify, marker_supervisor_id, shown
from reconciler.spec.specfiles import (
    SpecCache,
    SpecResult,
    flag_duplicate_ids,
    load_spec,
    load_spec_file,
    located,
    spec_result,
    spec_warnings,
    with_problems,
)
from reconciler.spec.validate import load_schema

__all__ = ["DirectoryState", "FileKind", "SpecCache", "classify", "load_directory", "load_files",
           "load_marker_file", "load_spec_file", "marker_supervisor_id", "spec_warnings"]


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
    bad_markers: Mapping[str, str] = field(default_factory=dict)  # shown path -> real path (not UTF-8)
    grants_checked: bool = False  # references were checked against the operator's grants
    hint: str | None = None  # no spec at the top level, but YAML files in subdirectories (nested_hint)

    def by_id(self) -> dict[str, SupervisorSpec]:
        """The valid specs by supervisor id (ids are unique among them)."""
        return {spec.id: spec for spec in self.specs.values()}

    @property
    def problems(self) -> list[SpecProblem]:
        """Every problem of every invalid spec and rejected marker, by file then line."""
        found = [
            p for e in (*self.invalid.values(), *self.rejected_markers.values()) for p in e.problems
        ]
        found += [SpecProblem(path, None, None, "", BAD_NAME) for path in self.bad_markers]
        return sorted(found, key=lambda p: (p.path, p.line or 0, p.column or 0))


def load_directory(
    directory: str | os.PathLike[str],
    *,
    now: datetime | None = None,
    check_permissions: bool = True,
    cache: SpecCache | None = None,
    progress: Callable[[], object] | None = None,
    grants: Grants | None = None,
) -> DirectoryState:
    """The whole top level of the spec directory, never raising for a bad file.

    With ``check_permissions`` (the default; off with the ``allowInsecureSpecs``
    setting) a directory writable by others is ``ok=False`` and such files are
    invalid or rejected (see ``permissions``). With ``cache`` (the daemon's, kept
    across passes) a spec file that did not change since it was last loaded is not
    read, parsed or validated again (see ``filecache``); markers always are. With
    ``grants`` (the daemon and ``plan`` always; ``validate`` when they are given) a spec
    naming a secret it was not granted is invalid. ``progress`` is called before each spec
    file (the daemon renews its leader lease there when due: a first pass over ten
    thousand files outlasts the lease's TTL).
    """
    shown_dir = os.fspath(directory)
    try:
        entries = sorted(os.scandir(shown_dir), key=lambda e: e.name)
    except FileNotFoundError:
        return DirectoryState(path=shown_dir, ok=False, error=f"spec directory {shown_dir} does not exist")
    except NotADirectoryError:
        return DirectoryState(
            path=shown_dir, ok=False, error=f"spec directory {shown_dir} is not a directory"
        )
    except OSError as exc:
        return DirectoryState(
            path=shown_dir,
            ok=False,
            error=f"spec directory {shown_dir} cannot be read: {exc.strerror or exc}",
        )
    if check_permissions:
        refused = permissions.insecure_reason(shown_dir)
        if refused:
            return DirectoryState(path=shown_dir, ok=False, error=refused)
    if cache is not None:
        cache.begin()
    results: list[SpecResult] = []
    marker_entries: list[tuple[str, bool]] = []
    bad_markers: dict[str, str] = {}
    for entry in entries:
        kind = classify(entry.name)
        name = shown(entry.name)
        full = os.path.join(shown_dir, name)
        if kind == "spec" and not _is_dir(entry):
            if progress is not None:
                progress()
            real = entry.path if name != entry.name else None
            result = spec_result(full, shown_dir, now, check_permissions, cache,
                                 is_symlink=_is_symlink(entry), real=real)
            results.append(with_problems(result, [SpecProblem(full, None, None, "", BAD_NAME)]) if real else result)
        elif kind == "marker":
            if name != entry.name:
                bad_markers[full] = entry.path
            else:
                marker_entries.append((full, _is_dir(entry)))
    if cache is not None:
        cache.retain(r.path for r in results if r.real is None)
    results = _judged(results, grants)
    id_pattern = re.compile(load_schema("spec")["properties"]["id"]["pattern"])
    known = {r.id for r in results if r.id and id_pattern.search(r.id)}  # '../x' names no marker
    markers, rejected = load_markers(marker_entries, shown_dir, known, now, check_permissions)
    state = _directory_state(shown_dir, results, markers, rejected, bad_markers, grants is not None)
    return state if results else replace(state, hint=nested_hint(shown_dir))


def nested_hint(directory: str | os.PathLike[str], *, most: int = 200) -> str | None:
    """When the directory holds no spec at its top level (the only level watched) but its
    subdirectories hold YAML files, what to do about it: the usual cause is a config repo cloned
    whole into the spec directory, its specs one level down. None otherwise. Reads at most
    ``most`` entries per subdirectory, and never a dot-directory (``.git``)."""
    found: dict[str, int] = {}
    try:
        subdirs = sorted(e.path for e in os.scandir(directory) if not e.name.startswith(".") and _is_dir(e))
        for sub in subdirs:
            with os.scandir(sub) as it:
                names = [e.name for _, e in zip(range(most), it, strict=False)]
            count = sum(1 for n in names if classify(n) == "spec")
            if count:
                found[sub] = count
    except OSError:
        return None  # what cannot be read is reported by the load itself
    if not found:
        return None
    where = ", ".join(f"{path} ({n} YAML file{'s' if n != 1 else ''})" for path, n in found.items())
    return (f"no spec at the top level of {os.fspath(directory)}, which is the only level read, but its "
            f"subdirectories hold some: {where}; point the specs setting (--specs, RECONCILER_SPECS) "
            "at the directory that holds the spec files")


def load_files(
    paths: Iterable[str | os.PathLike[str]],
    *,
    now: datetime | None = None,
    grants: Grants | None = None,
) -> list[DirectoryState]:
    """Spec and marker files named one by one (a pre-commit hook's), one state per
    directory: the files of one directory are judged together as the daemon would judge
    them (duplicate ids, the cross-file rules), each against the others named with it and
    against the directory's other spec files, which the daemon reads beside them (a hook
    names only the changed files; the others are judged with them, never reported)."""
    groups: dict[str, tuple[list[SpecResult], list[Marker], dict[str, SpecInvalid]]] = {}
    spelled: dict[str, str] = {}  # directory -> as the caller spelled it
    for path in paths:
        raw = os.fspath(path)
        display = shown(raw)
        real = raw if display != raw else None
        spelled.setdefault(os.path.dirname(os.path.abspath(raw)), os.path.dirname(display))
        results, markers, rejected = groups.setdefault(os.path.dirname(os.path.abspath(raw)), ([], [], {}))
        if classify(raw) == "marker":
            if real is not None:
                rejected[display] = SpecInvalid([SpecProblem(display, None, None, "", BAD_NAME)])
                continue
            try:
                markers.append(load_marker_file(raw, now=now))
            except SpecInvalid as exc:
                rejected[display] = exc
        else:
            result = load_spec(display, None, now, real=real)
            results.append(with_problems(result, [SpecProblem(display, None, None, "", BAD_NAME)]) if real else result)
    states = []
    for directory, (results, markers, rejected) in groups.items():
        others = _siblings(directory, spelled[directory], {os.path.abspath(r.path) for r in results}, now)
        judged = _judged(results + others, grants)[:len(results)]
        states.append(_directory_state(directory, judged, markers, rejected, {}, grants is not None))
    return states


def _siblings(directory: str, spelled: str, named: set[str], now: datetime | None) -> list[SpecResult]:
    """The directory's spec files not named (unreadable directory: none)."""
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return []
    out = []
    for name in names:
        path = os.path.join(spelled, name)
        if (classify(name) == "spec" and shown(name) == name and os.path.abspath(path) not in named
                and os.path.isfile(path)):
            out.append(load_spec(path, None, now))
    return out


def _judged(results: list[SpecResult], grants: Grants | None) -> list[SpecResult]:
    """``results`` with the rules of every pass applied: duplicate ids, the operator's
    grants, and the rules that compare the valid files."""
    results = list(results)
    flag_duplicate_ids(results)
    if grants is not None:
        for i, r in enumerate(results):
            if r.spec is not None and not r.problems:
                refused = references.grant_findings(r.spec.document, grants, r.path)
                if refused:
                    results[i] = with_problems(r, located(r, refused))
    clashes = crossfile.findings([crossfile.Entry(r.path, r.spec) for r in results if r.spec is not None
                                  and not r.problems])
    if clashes:
        results = [with_problems(r, located(r, clashes[r.path])) if r.path in clashes else r for r in results]
    return results


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir()
    except OSError:
        return False  # reading it reports why


def _is_symlink(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_symlink()
    except OSError:
        return False


def _directory_state(
    shown_dir: str, results: list[SpecResult], markers: list[Marker], rejected: dict[str, SpecInvalid],
    bad_markers: dict[str, str], grants_checked: bool,
) -> DirectoryState:
    specs = {r.path: r.spec for r in results if r.spec is not None and not r.problems}
    invalid = {r.path: SpecInvalid(r.problems) for r in results if r.problems}
    invalid_ids: dict[str, str] = {}
    for r in results:
        if r.problems:
            invalid_ids.setdefault(r.id or file_stem(r.path), r.path)
    warnings = tuple(w for r in results if not r.problems and r.spec for w in r.warnings)
    return DirectoryState(
        path=shown_dir,
        ok=True,
        specs=MappingProxyType(specs),
        invalid=MappingProxyType(invalid),
        invalid_ids=MappingProxyType(invalid_ids),
        markers=tuple(markers),
        rejected_markers=MappingProxyType(rejected),
        warnings=warnings,
        bad_markers=MappingProxyType(dict(bad_markers)),
        grants_checked=grants_checked,
    )
