"""Names in the watched directory: what a name is (spec, marker, ignored) and how it is shown.

Decided by the name alone. A name that is not valid UTF-8 (Python hands it over with
surrogate escapes) cannot be logged, stored in the database or printed as it is: it is
shown with its bad bytes escaped (``\\xff``), reported as an invalid file, and never
stored; a marker named that way is rejected (renamed ``.rejected`` by the pass) and never
applied.
"""

from __future__ import annotations

import os
from typing import Literal

from reconciler.model import MARKER_SUFFIXES, SPEC_SUFFIXES, file_stem

FileKind = Literal["spec", "marker", "ignored"]

BAD_NAME = ("the file name is not valid UTF-8 (shown with its bytes escaped); it is never read as a "
            "spec or applied as a marker: rename it")


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


def shown(name: str) -> str:
    """A directory entry's name as text that can be printed and stored: itself when it is
    valid UTF-8, else its bytes with the invalid ones escaped (``clicks\\xff.yaml``)."""
    try:
        name.encode("utf-8")
        return name
    except UnicodeEncodeError:
        return os.fsencode(name).decode("utf-8", "backslashreplace")
