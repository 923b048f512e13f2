"""Marker files (``<id>.reset.yaml``): read, validate and type them, or reject them with the reason.

Markers are read on every pass (never cached): a marker that is a directory, and every one
of two or more valid markers for one supervisor in the same pass (``a.reset.yaml`` beside
``a.reset.yml``), is rejected with the reason, never applied. Retiring them after they were
handled is ``markerfiles``.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable
from datetime import datetime

from reconciler.errors import SpecInvalid, SpecProblem
from reconciler.model import Marker, Position
from reconciler.spec import permissions
from reconciler.spec.names import marker_supervisor_id
from reconciler.spec.specfiles import read
from reconciler.spec.validate import load_schema, sort_problems, validate_document
from reconciler.spec.yamlsafe import parse_yaml

_MARKER_IS_DIRECTORY = (
    "is a directory: a marker must be a regular file (<id>.reset.yaml); renamed .rejected"
)


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
    data = read(display, root)
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


def load_markers(
    entries: list[tuple[str, bool]],
    shown: str,
    known: set[str],
    now: datetime | None,
    check_permissions: bool,
) -> tuple[list[Marker], dict[str, SpecInvalid]]:
    """(valid markers, rejected ones by path) of ``entries``: (path, is a directory)."""
    markers: list[Marker] = []
    rejected: dict[str, SpecInvalid] = {}
    for full, is_dir in entries:
        try:
            if is_dir:
                raise SpecInvalid([SpecProblem(full, None, None, "", _MARKER_IS_DIRECTORY)])
            refused = permissions.insecure_reason(full) if check_permissions else None
            if refused:
                raise SpecInvalid([SpecProblem(full, None, None, "", refused)])
            markers.append(load_marker_file(full, known, root=shown, now=now))
        except SpecInvalid as exc:
            rejected[full] = exc
    return _reject_ambiguous(markers, rejected)


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
