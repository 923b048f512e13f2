"""The ``reconciler`` command line (click), one module per command family.

``base`` holds the group, its context and conventions; ``specs`` (validate, plan,
apply), ``run``, ``supervisors`` (status, history, reset, suspend, resume),
``backfills``, ``tables`` (segments, verify), ``maintain`` (compact, maintain) and
``db`` each register their commands on it. The package may import every layer below
it; nothing imports the package.
"""

from __future__ import annotations

import sys

import click

from reconciler.cli import backfills, db, deadletter, maintain, run, specs, supervisors, tables  # noqa: F401  (register)
from reconciler.cli.base import cli
from reconciler.cli.supervisors import parse_position
from reconciler.errors import Misconfigured, ReconcilerError
from reconciler.spec import secrets

__all__ = ["cli", "main", "parse_position"]


def main() -> None:
    from reconciler.pipeline import arrowpool

    arrowpool.prefer_in_environment()  # before anything imports pyarrow: Arrow C++ reads it once
    try:
        cli(standalone_mode=True)
    except ReconcilerError as exc:  # a command let one through: still a clean message, exit 1 (2: a setting)
        click.echo(f"Error: {secrets.scrub(str(exc))}", err=True)
        sys.exit(2 if isinstance(exc, Misconfigured) else 1)
