"""Retiring consumed marker files: ``<id>.reset.yaml`` → ``.applied`` or ``.rejected``.

The result is appended as YAML comments so the renamed file tells its own story; a
marker that is a symlink, not a regular file, or oversized is only renamed (never
followed or read: a symlink to a file outside the directory must not be copied in).
No write follows a link: the new file is written under a name ``mkstemp`` invents in the
same directory (created with O_EXCL, so a link planted at any fixed name, say a dotfile
committed to the repo, is never opened) and renamed over the result's name (a rename
replaces a link there, it never writes through it).
Renaming can fail (read-only checkout, permissions); the request is recorded in the
database first, so a marker that cannot be renamed is still applied only once and
the next tick tries the rename again.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import tempfile
from datetime import UTC, datetime
from pathlib import Path

import yaml

from reconciler.spec.names import shown
from reconciler.spec.yamlsafe import MAX_BYTES

log = logging.getLogger(__name__)


def retire(path: str, status: str, result: dict) -> str | None:
    """Rename ``path`` to ``path.<status>`` with ``result`` appended; returns the new path or None."""
    src = Path(path)
    dst = src.with_name(src.name + f".{status}")
    n = 1
    while os.path.lexists(dst):  # never overwrite an earlier result (two retirements in the same second)
        dst = src.with_name(src.name + f".{datetime.now(UTC):%Y%m%dT%H%M%S}{f'-{n}' if n > 1 else ''}.{status}")
        n += 1
    try:
        st = src.lstat()
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_BYTES:
            # A symlink (maybe to a file outside the directory), FIFO or huge file is moved
            # as it is: never followed, read or copied (its result is in the database).
            os.replace(src, dst)
            return str(dst)
        fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with open(fd, "rb") as fh:
            body = fh.read(MAX_BYTES + 1)
        stamp = datetime.now(UTC).isoformat(timespec="seconds")
        # one line per field, however long: a reason folded across comment lines could not be
        # found with grep (and where YAML folds depends on the path's length)
        comment = yaml.safe_dump(result, sort_keys=False, default_flow_style=False, allow_unicode=True,
                                 width=1_000_000)
        lines = [f"# {status} at {stamp} by stream-reconciler"] + [f"# {line}" for line in comment.splitlines()]
        data = body + (b"" if body.endswith(b"\n") or not body else b"\n") + ("\n".join(lines) + "\n").encode()
        _write_new(dst, data, stat.S_IMODE(st.st_mode) & 0o666)
        src.unlink()
        return str(dst)
    except FileNotFoundError:
        return None  # someone else retired it already
    except OSError as exc:
        log.warning("marker %s was %s but could not be renamed: %s; will retry", shown(path), status,
                    exc.strerror)
        return None


def _write_new(dst: Path, data: bytes, mode: int) -> None:
    """``data`` as the file ``dst``: written to a fresh temporary file beside it, then renamed."""
    fd, tmp = tempfile.mkstemp(dir=dst.parent, prefix=f".{dst.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            os.fchmod(fh.fileno(), mode)
        os.replace(tmp, dst)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
