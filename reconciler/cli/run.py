"""``run``: the daemon."""

from __future__ import annotations

import sys

import click

from reconciler.cli.base import ConfigError, Context, cli, pass_ctx
from reconciler.errors import Misconfigured, ReconcilerError


@cli.command(epilog="""\b
Examples:
  reconciler --specs specs run                     the daemon over specs/: one Kafka supervisor, 127.0.0.1:9092
  reconciler --specs specs run --until-caught-up   ingest what the topic holds now, then exit 0
  reconciler --config /etc/stream-reconciler/config.yaml run   the service (scripts/install.sh)""")
@click.option("--until-caught-up", is_flag=True,
              help="Exit 0 once every running supervisor has ingested up to the latest offsets seen at start "
                   "and every backfill supervisor has completed; exit 1, naming what is not caught up, when "
                   "a supervisor stays UNHEALTHY for 60s, on --timeout, or when stopped by a signal first.")
@click.option("--timeout", type=float, default=None, metavar="SECONDS",
              help="With --until-caught-up: give up (exit 1) after this long.")
@pass_ctx
def run(c: Context, until_caught_up, timeout):
    """Run the daemon: watch the spec directory, reconcile, and ingest.

    Reconciles on every file change (debounced) and every tick; runs one runtime per
    RUNNING supervisor beside the tick loop. SIGTERM finishes or fences in-flight
    batches and exits; a second SIGTERM exits at once (exactly-once still holds).
    """
    from reconciler.daemon import Daemon
    from reconciler.pipeline import heap

    if not until_caught_up:  # the long-running daemon: its heap settles after the first batch
        heap.enable()  # (a run that exits once caught up has no later batch to spare the pauses)
    try:
        code = Daemon(c.settings, config_path=c.config, cli_values=c.cli_values).run(
            until_caught_up=until_caught_up, timeout=timeout)
    except Misconfigured as exc:  # a setting the daemon cannot work with: one line, exit 2
        raise ConfigError(str(exc)) from None
    except ReconcilerError as exc:
        raise click.ClickException(str(exc)) from None
    sys.exit(code)
