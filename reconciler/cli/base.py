"""The command group, its shared context and the conventions every command follows.

Commands are thin: they load settings, call the same functions the daemon calls, and
print tables or JSON. A refusal is ``Error: ...`` on stderr (with ``-o json``:
``{"ok": false, "error": ...}`` on stdout) and exit 1. Each command family registers
itself on ``cli`` from its own module; this module imports none of them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import NoReturn

import click

from reconciler import logs
from reconciler import settings as settings_mod
from reconciler.errors import Misconfigured, ReconcilerError
from reconciler.spec import grants, secrets

EPILOG = "Settings: each global option is also an environment variable and a config file key (see docs/settings.md)."


def _echo_json(doc) -> None:
    click.echo(json.dumps(doc, indent=2, default=_json_value))


def _json_value(value):
    """Times as ISO-8601 with their zone (SQLite hands back naive UTC datetimes)."""
    if isinstance(value, datetime):
        return (value if value.tzinfo else value.replace(tzinfo=UTC)).isoformat()
    return str(value)


class ConfigError(click.ClickException):
    """A setting that cannot work: ``Error: <setting>: <why>`` on one line, exit 2."""

    exit_code = 2


class Context:
    """Lazily built settings and store, shared by the commands of one invocation."""

    def __init__(self, cli_values: dict, config: str | None):
        self.cli_values = cli_values
        self.config = config
        self._settings = None
        self._store = None

    @property
    def settings(self):
        if self._settings is None:
            self._settings = settings_mod.load(self.cli_values, self.config)
        return self._settings

    @property
    def store(self):
        """The store of a command that acts on what exists (a reset, a suspension, a backfill's
        control, compaction): the database must be there already. Such a command never creates
        a database, nor migrates one: a typo in --state-dir, or a dry run, must not leave an empty
        database behind that `status` then reads as "no supervisors"."""
        return self.read_store

    @property
    def creating_store(self):
        """The store of the commands that create the database when there is none (`apply`,
        `db upgrade`), migrated to this version's schema."""
        if self._store is None:
            from reconciler.store.schema import is_current
            from reconciler.store.store import Store

            make_state_dir(self.settings)
            self._store = Store(self.settings.db_url)
            if not is_current(self._store.engine):  # alembic only when there is something to upgrade
                self._store.migrate()
        return self._store

    @property
    def read_store(self):
        """The store for a command that only reads: never created, never migrated. A database
        that does not exist yet is an error (``no database at ...``), and so is a schema of
        another version than this one reads (``reconciler db upgrade``)."""
        if self._store is None:
            store = self.existing_store()
            if store is None:
                raise click.ClickException(
                    f"no database at {self.database_shown()}: nothing has run with these settings yet "
                    "(check --db / --state-dir, or the config file the daemon uses)")
            self._store = store
        return self._store

    def existing_store(self):
        """The store of a database that exists and holds this version's schema, opened without
        writing anything; None when there is no database, or no schema in it, yet."""
        from reconciler.store.schema import head_revision
        from reconciler.store.store import Store

        if self._store is not None:
            return self._store
        if _missing_sqlite_file(self.settings.db_url) is not None:
            return None  # opening it would create it (and its directory)
        store = Store(self.settings.db_url)
        try:
            revision = store.revision()
        except ReconcilerError as exc:
            store.close()
            raise click.ClickException(str(exc)) from None
        head = head_revision()
        if revision is not None and head is not None and revision != head:
            store.close()
            raise click.ClickException(
                f"the database at {self.database_shown()} has schema revision {revision}, and this "
                f"version of reconciler reads {head}: upgrade it with `reconciler db upgrade` (the "
                "daemon does when it starts), or use the reconciler version that wrote it")
        if revision is None:
            store.close()
            return None
        return store

    def database_shown(self) -> str:
        """The database, as an error message names it: a SQLite file's path, else the URL
        without its password."""
        from reconciler.spec.secrets import redact_uri

        url = self.settings.db_url
        return _sqlite_file(url) or redact_uri(url)


def make_state_dir(settings) -> None:
    """The state directory, or ``ConfigError`` naming the setting (never a traceback)."""
    try:
        settings.state_path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"setting stateDir (--state-dir, RECONCILER_STATE_DIR): cannot create "
                            f"{settings.state_path}: {exc.strerror or exc}") from None


def _sqlite_file(url: str) -> str | None:
    """The path of a file-based SQLite database, else None."""
    from sqlalchemy.engine import make_url

    try:
        parsed = make_url(url)
    except Exception:  # a malformed URL is reported by the store with its own message
        return None
    if not parsed.drivername.startswith("sqlite") or parsed.database in (None, "", ":memory:"):
        return None
    if parsed.database.startswith("file:"):
        return None
    return parsed.database


def _missing_sqlite_file(url: str) -> str | None:
    """The path of a file-based SQLite database that does not exist, else None."""
    path = _sqlite_file(url)
    return None if path is None or Path(path).exists() else path


pass_ctx = click.make_pass_decorator(Context)


def _setting_options(func):
    """One global option per setting, generated from ``settings.Settings`` (declared once)."""
    choices = {"log_format": click.Choice(["text", "json"]),
               "log_level": click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False)}
    for name, env, key, help_text in reversed(settings_mod.describe()):
        flag = "--" + name.replace("_", "-")
        func = click.option(flag, name, type=choices.get(name), metavar=None if name in choices else "VALUE",
                            multiple=name in settings_mod.MULTIPLE,
                            help=f"{help_text[0].upper()}{help_text[1:]} [{env}; config key {key}].")(func)
    return func


class _ScrubbedGroup(click.Group):
    """Every refusal a command prints passes ``secrets.scrub``: a message may quote what a
    client library echoed of a secret this process resolved (a reset's capture, status's lag)."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except click.ClickException as exc:
            exc.message = secrets.scrub(exc.message)
            raise
        except Misconfigured as exc:  # a setting that cannot work, found once a command used it
            raise ConfigError(secrets.scrub(str(exc))) from None


@click.group(cls=_ScrubbedGroup, epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--config", metavar="FILE", envvar="RECONCILER_CONFIG",
              help="YAML config file [RECONCILER_CONFIG; default /etc/stream-reconciler/config.yaml if present].")
@_setting_options
@click.version_option(package_name="stream-reconciler")
@click.pass_context
def cli(ctx, config, **values):
    """Reconcile stream-ingestion supervisors declared in YAML files.

    \b
    Quick tour:
      reconciler validate specs/          check every spec and marker
      reconciler plan                     what apply would change (exit 2 if anything)
      reconciler apply                    one reconcile pass, no ingestion
      reconciler run                      the daemon: watch, reconcile, ingest
      reconciler status                   state, checkpoints, lag
      reconciler reset clicks --to latest --dry-run

    Example: reconciler --specs examples --state-dir /tmp/state plan
    """
    ctx.obj = Context(values, config)
    try:
        s = ctx.obj.settings
        granted = grants.Grants.from_settings(s)
    except ReconcilerError as exc:  # every refusal here is about a setting
        raise ConfigError(str(exc)) from None
    grants.grant(granted)  # before any client or Spark worker may resolve a reference
    if s.remote_warehouse or s.object_store:  # an s3:// warehouse; its secret references need the grants
        from reconciler.table import storage

        try:
            storage.configure_from(s)
        except ReconcilerError as exc:
            raise ConfigError(str(exc)) from None
    secrets.redact_uri(s.db_url)  # teaches the scrubber the database password, should anything quote it
    logs.setup(s.log_level, s.log_format)
    if ctx.invoked_subcommand != "run":  # the daemon keeps them: its log is where a client's surprise shows
        ctx.call_on_close(logs.quiet_clients(s.log_level))


def _refuse(message: str, output: str, **fields) -> NoReturn:
    """A refusal, printed once: as ``Error: ...`` on stderr, or with ``-o json`` as
    ``{"ok": false, "error": ...}`` on stdout (a script reading JSON gets JSON); exit 1."""
    message = secrets.scrub(message)
    if output == "json":
        _echo_json({"ok": False, "error": message, **fields})
        sys.exit(1)
    raise click.ClickException(message)


@contextlib.contextmanager
def _quiet(logger: str):
    """Hold back a logger's lines while the command itself reports the same outcome (as the
    CLI's setup does for the brokers' clients), unless ``--log-level DEBUG`` asks for them."""
    log = logging.getLogger(logger)
    level = log.level
    if not logging.getLogger().isEnabledFor(logging.DEBUG):
        log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(level)


def _supervisor(c: Context, supervisor_id: str):
    rec = c.store.get(supervisor_id)
    if rec is None:
        raise click.ClickException(f"no supervisor '{supervisor_id}' (see `reconciler status`)")
    return rec


def _user() -> str:
    from reconciler.control.requests import _user as user

    return user()
