"""Who may write the spec directory: refuse specs and markers that others could have written.

Called by ``loader.load_directory`` at the start of every tick, before any file is
read. Whoever can write a spec or a marker can point ingestion at any stream,
reset checkpoints and read any ``${env:}``/``${file:}`` secret the daemon can read,
so a directory or file that is writable by others (``o+w``), or group-writable by
a group that is not the daemon's own, is refused:

* an insecure directory makes the whole tick see the directory as unreadable
  (``DirectoryState.ok = False``): nothing destructive is planned, no resets;
* an insecure file is invalid (spec: keeps its last good spec; marker: rejected).

Only the mode bits and the group count, not the owner: the daemon may run as root.
The check can be switched off with the ``allowInsecureSpecs`` setting.
"""

from __future__ import annotations

import os
import stat

SETTING = "allowInsecureSpecs"


def insecure_reason(path: str | os.PathLike[str], shown: str | None = None) -> str | None:
    """Why ``path`` (followed through symlinks) must not be trusted, or None when it is fine.

    A path that cannot be stat'ed is not judged here: reading it reports that.
    """
    shown = shown if shown is not None else os.fspath(path)
    try:
        st = os.stat(path)
    except OSError:
        return None
    return describe_mode(shown, st.st_mode, st.st_gid, is_dir=stat.S_ISDIR(st.st_mode))


def describe_mode(shown: str, mode: int, gid: int, *, is_dir: bool = False) -> str | None:
    """The refusal message for a mode and group, or None when only we can write."""
    perms = stat.S_IMODE(mode)
    octal = f"{perms:04o}"
    what = f"spec directory {shown}" if is_dir else shown
    if perms & stat.S_IWOTH:
        return (
            f"{what} is writable by others (mode {octal}): refused; "
            f"fix with chmod o-w {shown}, or set {SETTING}"
        )
    if perms & stat.S_IWGRP and not _our_group(gid):
        return (
            f"{what} is writable by group {_group_name(gid)} (mode {octal}), which is not "
            f"the daemon's group: refused; fix with chmod g-w {shown}, or set {SETTING}"
        )
    return None


def _our_group(gid: int) -> bool:
    return gid == os.getegid()


def _group_name(gid: int) -> str:
    try:
        import grp

        return f"{grp.getgrgid(gid).gr_name} ({gid})"
    except (ImportError, KeyError):
        return str(gid)
