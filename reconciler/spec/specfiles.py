"""One spec file: read, parse, validate and type it, or say everything that is wrong.

``load_directory`` calls ``spec_result`` for every spec file of a pass (from its
``SpecCache`` when the file did not change); ``load_spec_file`` is the same for a file
named alone. A valid result keeps its spec, not its parse: the checks that run on every pass
(the operator's grants, the rules that compare files) work on the document, and ``located``
parses the file again for positions only when one of them found something. Duplicate ids
are flagged here too.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field, replace
from datetime import datetime

from reconciler.errors import SpecInvalid, SpecProblem
from reconciler.model import SupervisorSpec, file_stem
from reconciler.spec import names, permissions, secrets
from reconciler.spec.filecache import FileCache, FileKey
from reconciler.spec.validate import sort_problems, validate_document
from reconciler.spec.yamlsafe import ParsedYaml, YamlPath, format_field, parse_yaml, read_limited

_ID_LINE = re.compile(r"""^id:[ \t]*["']?([^"'\s#]+)""", re.MULTILINE)


@dataclass
class SpecResult:
    """One spec file's outcome; once cached it is shared by later passes and never changed."""

    path: str  # as shown to people (escaped when the name is not valid UTF-8)
    spec: SupervisorSpec | None = None
    problems: list[SpecProblem] = field(default_factory=list)
    id: str | None = None  # as declared, or recovered from a broken file
    id_from_document: bool = False  # the id came from a parsed mapping (reliable)
    id_line: tuple[int | None, int | None] = (None, None)
    warnings: tuple[SpecProblem, ...] = ()
    parsed: ParsedYaml | None = None  # kept while validation fails: validated again each pass
    revalidate: bool = False  # a future time may come
    real: str | None = None  # the path to read, when it differs from ``path``
    root: str | None = None  # the spec directory (a link must not leave it)


SpecCache = FileCache[SpecResult]


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
    result = load_spec(os.fspath(path), root, now)
    if result.problems:
        raise SpecInvalid(result.problems)
    assert result.spec is not None
    return result.spec


def spec_warnings(path: str | os.PathLike[str], spec: SupervisorSpec,
                  id_line: tuple[int | None, int | None] = (None, None)) -> list[SpecProblem]:
    """Advice that does not invalidate a spec: the file name differs from ``specs/<id>.yaml``
    (at ``id_line``, where ``id`` is written: the supervisor is the id's, so a misspelt id
    makes a new one); a secret is written out instead of referenced."""
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
                *id_line,
                "id",
                f"id '{spec.id}' differs from the file name; by convention the file is {spec.id}.yaml",
            ),
        )
    return out


def spec_result(
    full: str,
    shown: str,
    now: datetime | None,
    check_permissions: bool,
    cache: SpecCache | None,
    *,
    is_symlink: bool = False,
    real: str | None = None,
) -> SpecResult:
    """One spec file: from the cache when unchanged, else loaded (and cached). ``full`` is
    the path shown; ``real`` the one to read when they differ (a name not valid UTF-8)."""
    read_at = time.time_ns()
    target = real or full
    try:
        st = os.stat(target)
    except OSError:
        return load_spec(full, shown, now, real=real)  # dangling symlink, vanished: reading reports why
    if check_permissions:
        refused = permissions.describe_mode(full, st.st_mode, st.st_gid)
        if refused:  # never trusted, cached or not; its id is still recovered
            result = load_spec(full, shown, now, real=real)
            result.problems, result.spec = [SpecProblem(full, None, None, "", refused)], None
            return result
    if cache is None or real is not None:
        return load_spec(full, shown, now, real=real)
    key = FileKey.of(st, os.path.realpath(full) if is_symlink else None)
    cached = cache.lookup(full, key, lambda: _read_or_none(full, shown))
    if cached is not None:
        return _revalidated(cached, now) if cached.revalidate else cached
    data: list[bytes] = []
    result = load_spec(full, shown, now, data)
    cache.store(full, key, data[0] if data else b"", read_at, result)
    return result


def _revalidated(cached: SpecResult, now: datetime | None) -> SpecResult:
    """A cached file that failed validation is validated again (not parsed): a timestamp in
    the future becomes valid once its time has come."""
    assert cached.parsed is not None
    result = SpecResult(path=cached.path, real=cached.real, root=cached.root)
    _finish(result, cached.parsed, now)
    return result


def _read_or_none(display: str, root: str) -> bytes | None:
    try:
        return read(display, root)
    except SpecInvalid:
        return None


def load_spec(
    display: str,
    root: str | os.PathLike[str] | None,
    now: datetime | None,
    data_out: list[bytes] | None = None,
    *,
    real: str | None = None,
) -> SpecResult:
    """Read, parse, validate and type one spec file; ``data_out`` receives the bytes read."""
    result = SpecResult(path=display, real=real, root=os.fspath(root) if root is not None else None)
    data = b""
    try:
        data = read(display, root, real=real)
        if data_out is not None:
            data_out.append(data)
        parsed = parse_yaml(data, display)
    except SpecInvalid as exc:
        result.problems = exc.problems
        result.id = _recover_id(data) or file_stem(display)
        return result
    _finish(result, parsed, now)
    return result


def _finish(result: SpecResult, parsed: ParsedYaml, now: datetime | None) -> None:
    """Validate and type a parsed spec into ``result``."""
    display = result.path
    _note_id(result, parsed)
    result.problems = validate_document(parsed, "spec", now=now)
    if result.problems:
        result.parsed, result.revalidate = parsed, True
    else:
        try:
            result.spec = SupervisorSpec.from_document(parsed.data)
        except (KeyError, TypeError, ValueError) as exc:  # the schema should have caught it
            result.problems = [
                SpecProblem(display, None, None, "", f"cannot build the spec: {exc}")
            ]
    if result.spec is not None and not result.problems:
        secrets.learn_literals(parsed.data.get("source"))  # scrubbed from the first line that may quote them
        result.warnings = tuple(spec_warnings(display, result.spec, result.id_line))


def _note_id(result: SpecResult, parsed: ParsedYaml) -> None:
    value = parsed.data.get("id")
    if isinstance(value, str) and value:
        result.id, result.id_from_document = value, True
        result.id_line = parsed.key_position(("id",))
    else:
        result.id = file_stem(result.path)


def flag_duplicate_ids(results: list[SpecResult]) -> None:
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
            results[i] = with_problems(r, [problem])


def located(result: SpecResult, found: list[tuple[YamlPath, str]]) -> list[SpecProblem]:
    """``found`` (field, message) as problems of ``result``'s file, with the line and column
    of each field: the file is parsed again for them (rare: only when a rule found something)."""
    parsed = result.parsed
    if parsed is None:
        try:
            parsed = parse_yaml(read(result.path, result.root, real=result.real), result.path)
        except SpecInvalid:  # changed meanwhile: the next pass reads it again; no positions now
            parsed = ParsedYaml(result.path, result.spec.document if result.spec else {})
    return [SpecProblem(result.path, *parsed.value_position(at), format_field(at), message) for at, message in found]


def with_problems(result: SpecResult, problems: list[SpecProblem]) -> SpecResult:
    """A copy of ``result`` (perhaps the cache's) with ``problems`` added: invalid."""
    return replace(result, problems=sort_problems([*result.problems, *problems]), spec=None)


def read(display: str, root: str | os.PathLike[str] | None, *, real: str | None = None) -> bytes:
    path = real or display
    base = os.path.realpath(root if root is not None else (os.path.dirname(display) or "."))
    if os.path.islink(path):
        target = os.path.realpath(path)
        if os.path.commonpath([base, target]) != base:
            raise SpecInvalid(
                [
                    SpecProblem(
                        display,
                        None,
                        None,
                        "",
                        f"symlink leaves the spec directory (points to {names.shown(target)})",
                    )
                ]
            )
        if not os.path.exists(target):
            raise SpecInvalid(
                [SpecProblem(display, None, None, "", "symlink points to a missing file")]
            )
    return read_limited(path, display)


def _recover_id(data: bytes) -> str | None:
    match = _ID_LINE.search(data.decode("utf-8", errors="replace")) if data else None
    return match.group(1) if match else None
