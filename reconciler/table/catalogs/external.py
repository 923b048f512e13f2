"""The output tables in the lake's own catalog (``catalog: {type: glue | rest}``).

pyiceberg's own ``GlueCatalog`` or ``RestCatalog`` (``load_catalog``) holds the tables; this
adapter offers the interface of ``catalog.Tables`` that the runtime uses. The difference is
the commit: the catalog moves the table's pointer itself (Glue's ``VersionId``, a REST
server's requirements check), so it cannot join our database transaction. The publish
(``runtime.publish_external``) commits the table first, asserting the supervisor's fence tag
(``fence.py``), and the database follows.

Each commit here is exactly one ``commit_table`` call with the requirements built once:
pyiceberg's own retry loop (``commit.retry.num-retries``) rebuilds a retried commit's
requirements and drops every ``AssertRefSnapshotId``, the fence with them. A conflict comes
back as ``TableConflict`` and the caller stages again on the table as it is then, with the
same fence.

A compaction stages its change (``stage``) and ``Store.commit_tables`` finishes its write in
the database first, then commits it to the catalog (a crash in between leaks its files to
orphan clean-up, never deletes a referenced one). Expiry stages the same way, with an empty
snapshot of its own (``stage``). Orphan clean-up reads the catalog's current metadata and lists
the warehouse. Replay and the layout import are refused with a message that names the setting.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyiceberg.catalog import load_catalog
from pyiceberg.exceptions import (
    CommitFailedException,
    NamespaceAlreadyExistsError,
    NoSuchTableError,
    TableAlreadyExistsError,
)
from pyiceberg.table import Table, TableProperties
from pyiceberg.table.refs import SnapshotRefType
from pyiceberg.table.update import (
    AddSnapshotUpdate,
    AssertRefSnapshotId,
    AssertTableUUID,
    SetSnapshotRefUpdate,
    update_table_metadata,
)

from reconciler import faults
from reconciler.errors import PermanentError, RetryableError
from reconciler.table import grace, retention, storage  # noqa: F401  (grace: the defaults)
from reconciler.table.catalog import (
    _TABLE_PROPERTIES,
    ROLLUP_PROPERTY,
    TIME,
    TableConflict,
    _delete_quietly,
    _Transaction,
    append_files,
    evolve_for_append,
    granularity_name,
)
from reconciler.table.locations import local_path
from reconciler.table.reach import _ManifestReader
from reconciler.table.schema import partition_transform
from reconciler.table.writeids import tag

log = logging.getLogger(__name__)

# Retries off for every commit pyiceberg makes on its own here (a table's creation): the
# publish makes its own single commits (above), and so the fence is never dropped.
_NO_RETRIES = {TableProperties.COMMIT_NUM_RETRIES: "0"}


# The maintenance writes that commit to an external catalog (``stage``); the others (replay,
# the layout import) are refused naming the setting, untested there.
STAGED_KINDS = ("compact", "expire")
_GLUE_RETRIES = "glue.max-retries"  # pyiceberg's default, 10 attempts, holds a step for minutes


class CatalogUnreachable(RetryableError):
    """The lake's catalog did not answer: the step is retried, and status shows why."""


class FenceMoved(Exception):
    """The supervisor's fence tag is no longer where the batch's step read it: a reset or
    another leader's batch came first. Nothing was committed."""


class ExternalTables:
    """``catalog.Tables``'s interface over pyiceberg's Glue or REST catalog."""

    PROTOCOL = "external"

    def __init__(self, engine, warehouse: str | os.PathLike[str], setting: Mapping[str, Any], *,
                 snapshots_kept: int = retention.DEFAULT_KEPT, reader_grace: float = grace.DEFAULT_READER_GRACE,
                 resolve: Callable[[str], str] | None = None):
        self.kind = setting["type"]
        self.namespace = setting.get("namespace") or "default"
        self.storage = storage.at(warehouse)
        if self.storage.remote:
            root = str(warehouse).rstrip("/")
            self.storage.ensure_bucket()
            io = storage.current().iceberg_properties()
        else:
            root = str(Path(local_path(str(warehouse))).absolute())
            Path(root).mkdir(parents=True, exist_ok=True)
            io = {}
        self.warehouse = root
        from reconciler.spec.secrets import is_secret_key, scrubber

        if resolve is None:
            from reconciler.spec.secrets import resolve as resolve_ref

            resolve = resolve_ref
        # Resolved here, when the catalog opens: the settings keep the references, never the secrets.
        props = {k: resolve(v) for k, v in (setting.get("properties") or {}).items()}
        for k, v in props.items():  # a literal secret too: never in a message this process prints
            if is_secret_key(k) and isinstance(v, str) and v:
                scrubber.learn(v)
        if str(props.get(_GLUE_RETRIES, "")).isdigit():  # pyiceberg hands it to botocore as given: a number
            props[_GLUE_RETRIES] = int(props[_GLUE_RETRIES])
        try:
            self.catalog = load_catalog(f"reconciler-{self.kind}", **{"type": self.kind, "warehouse": root,
                                                                      **io, **props})
        except Exception as exc:  # noqa: BLE001 - pyiceberg's and boto's many errors: one message
            raise CatalogUnreachable(f"setting catalog: the {self.kind} catalog cannot be opened "
                                     f"({type(exc).__name__}: {_short(exc)})") from None
        self._engine = engine
        self._lock = threading.Lock()
        self._namespace_ready = False
        self.snapshots_kept = snapshots_kept
        # What a publish's, a compaction's or an expiry's commit unreferences goes after the
        # readers' grace, as with sql.
        self.retired = grace.Retired(reader_grace, lambda files: _delete_quietly(self.storage, files))

    def _unsupported(self) -> PermanentError:
        return PermanentError(f"setting catalog: type {self.kind} does not support this yet (replay and the layout "
                              "import stage a pointer move in the metadata database, which only type sql has); "
                              "nothing was changed")

    def ident(self, name: str) -> tuple[str, str]:
        return (self.namespace, name)

    def location(self, name: str) -> str:
        """``<warehouse>/<namespace>/<table>``: where recovery and the clean-ups look for it."""
        return self.storage.join(self.warehouse, self.namespace, name)

    # -- tables -----------------------------------------------------------------------

    def load(self, name: str) -> Table | None:
        try:
            return _call(self.kind, lambda: self.catalog.load_table(self.ident(name)))
        except NoSuchTableError:
            return None

    def names(self) -> list[str]:
        try:
            return sorted(i[-1] for i in _call(self.kind, lambda: self.catalog.list_tables(self.namespace)))
        except CatalogUnreachable:
            raise
        except Exception:  # noqa: BLE001 - no namespace yet: no tables
            return []

    def ensure(self, name: str, schema: pa.Schema, granularity: str | None, *, rollup: bool | None = None) -> Table:
        table = self.load(name)
        if table is not None:
            return table
        with self._lock:
            if not self._namespace_ready:
                try:
                    _call(self.kind, lambda: self.catalog.create_namespace(self.namespace))
                except NamespaceAlreadyExistsError:
                    pass
                self._namespace_ready = True
            props = {**_TABLE_PROPERTIES, **_NO_RETRIES}
            if rollup is not None:
                props[ROLLUP_PROPERTY] = str(rollup).lower()
            try:
                tx = self.catalog.create_table_transaction(self.ident(name), schema=schema,
                                                           location=self.location(name), properties=props)
                if granularity is not None:
                    with tx.update_spec() as spec:
                        spec.add_field(TIME, partition_transform(granularity),
                                       f"{TIME}_{granularity_name(granularity)}")
                _call(self.kind, tx.commit_transaction)
            except (TableAlreadyExistsError, CommitFailedException):
                pass  # another process was first
            faults.point("table-created", name)
            table = self.load(name)
            if table is None:
                raise CatalogUnreachable(f"setting catalog: table {self.namespace}.{name} was created but the "
                                         f"{self.kind} catalog does not list it")
            log.info("created Iceberg table %s.%s at %s (%s catalog)", self.namespace, name, table.location(),
                     self.kind)
            return table

    def current(self, name: str) -> Table:
        table = self.load(name)
        if table is None:
            raise NoSuchTableError(f"{self.namespace}.{name}")
        return table

    def committed(self, commits: Sequence[Any]) -> None:
        """Nothing to remember: every staging reads the table from the catalog."""

    def data_dir(self, table: Table, batch_id: str) -> Path | str:
        from reconciler.table.writeids import BATCH_DIR_PREFIX

        if self.storage.remote:
            return self.storage.join(table.location(), "data", f"{BATCH_DIR_PREFIX}{batch_id}")
        return local_path(table.location()) / "data" / f"{BATCH_DIR_PREFIX}{batch_id}"

    def stage(self, name: str, build: Callable[[_Transaction], None], *, write_id: str, attempt: int = 0,
              expected: str | None = None) -> ExternalCommit:
        """A maintenance write's change of ``name`` (a compaction, an expiry), built on the
        table as it is now; ``Store.commit_tables`` commits it to the catalog
        (``ExternalCommit.commit``) after recording the write as committing in the database.

        A change that adds no snapshot (an expiry) gets an empty one of its own. Glue applies
        a commit's updates to the table as it is when the commit arrives, checking only the
        requirements, and nothing in Iceberg asserts a table's properties: a publish staged
        before an expiry and committed after it would set ``reconciler.expired-ranges`` from
        its older base and lose the ranges the expiry folded (or remove a snapshot the expiry
        removed already). Moving ``main`` makes the requirement every publish, fence and
        compaction carries on it (``AssertRefSnapshotId(main)``) refuse such a commit, and
        this one's refuse a commit that came first: a compare-and-swap on ``main``."""
        kind = self._write_kind(write_id)
        if kind not in STAGED_KINDS:
            raise self._unsupported()
        table = self.current(name)
        if expected is not None and table.metadata_location != expected:
            raise TableConflict(f"table {name}: planned on {expected}, now at {table.metadata_location}")
        tx = _Transaction(table)
        tx.tag = tag(write_id, attempt)
        build(tx)
        if not any(isinstance(u, AddSnapshotUpdate) for u in tx._updates):
            _empty_snapshot(tx, kind)
        requirements = (*tx._requirements, AssertTableUUID(uuid=table.metadata.table_uuid))
        staged = Table(identifier=table.name(), metadata=update_table_metadata(table.metadata, tx._updates),
                       metadata_location=table.metadata_location, io=table.io, catalog=self.catalog)
        return ExternalCommit(name, table.metadata_location, staged, write_id,
                              lambda: self._commit_staged(table, requirements, tx._updates))

    def stage_append(self, *_: Any, **__: Any):
        raise self._unsupported()  # the publish commits with its fence (``commit_append``)

    def _commit_staged(self, table: Table, requirements, updates) -> None:
        try:
            _call(self.kind, lambda: self.catalog.commit_table(table, requirements, updates))
        except CommitFailedException as exc:
            # A refusal may be a retry of our own update whose answer was lost: the table
            # decides (a conflict here puts the write back in flight, and its files are
            # deleted once it gives up, the table's current snapshot's files if it committed).
            added = [u.snapshot.snapshot_id for u in updates if isinstance(u, AddSnapshotUpdate)]
            now = self.load(table.name()[-1])
            if added and now is not None and _holds(now, added[0]):
                log.info("table %s: staged commit refused on retry, but the table holds its snapshot: committed",
                         table.name()[-1])
                return
            raise TableConflict(f"table {table.name()[-1]} changed since it was staged ({_short(exc)})") from None

    def _write_kind(self, write_id: str) -> str | None:
        import sqlalchemy as sa

        from reconciler.store.tables import writes

        with self._engine.connect() as c:
            return c.execute(sa.select(writes.c.kind).where(writes.c.write_id == write_id)).scalar()

    def discard_staged(self, commits: Sequence[Any]) -> None:
        """A commit that failed wrote its metadata file and manifests under the table: they
        name the write's tag, so recovery (or the write's own abandon) deletes them."""

    def write_metadata_files(self, name: str, write_id: str) -> list[str]:
        from reconciler.table.writeids import write_id_of_name

        folder = self.storage.join(self.location(name), "metadata")
        return sorted(x for x in self.storage.list(folder) if write_id_of_name(x.rsplit("/", 1)[-1]) == write_id)

    # -- the publish's commit ------------------------------------------------------------

    def commit_append(self, name: str, files: Sequence[str], properties: Mapping[str, str], *,
                      fence: tuple[str, int | None], schema: pa.Schema | None = None,
                      granularity: str | None = None, rollup: bool | None = None, write_id: str,
                      attempt: int = 0) -> int:
        """Commit one snapshot appending ``files`` to ``name`` with ``properties`` in its
        summary, if and only if the tag ``fence[0]`` is at snapshot ``fence[1]`` (None: the
        tag does not exist), and move the tag to the new snapshot in the same commit.
        Returns the new snapshot's id. ``FenceMoved`` when the tag moved, ``TableConflict``
        when anything else did (stage again), ``CatalogUnreachable`` when the catalog did not
        answer (the outcome may be unknown: the fence tag tells the next step)."""

        def build(tx: _Transaction) -> None:
            evolve_for_append(tx, name, schema=schema, granularity=granularity, rollup=rollup)
            append_files(tx, files, properties)

        return self.commit_fenced(name, build, fence=fence, write_id=write_id, attempt=attempt)

    def commit_fenced(self, name: str, build: Callable[[_Transaction], None], *, fence: tuple[str, int | None],
                      write_id: str, attempt: int = 0) -> int:
        """One commit of the snapshot ``build`` adds, asserting and moving the fence tag."""
        ref, head = fence
        table = self.current(name)
        if _ref(table, ref) != head:
            raise FenceMoved(f"table {name}: fence {ref} is at {_ref(table, ref)}, not {head}")
        tx = _Transaction(table)
        tx.tag = tag(write_id, attempt)
        build(tx)
        # The history kept short as with sql (retention.py): the tags' snapshots stay.
        retention.expire_beyond(tx, self.snapshots_kept, readers=self.retired.grace > 0)
        added = [u.snapshot.snapshot_id for u in tx._updates if isinstance(u, AddSnapshotUpdate)]
        if len(added) != 1:
            raise RuntimeError(f"commit to {name}: expected one new snapshot, got {len(added)}")
        requirements = (*tx._requirements, AssertTableUUID(uuid=table.metadata.table_uuid))
        if table.metadata.snapshots:
            requirements += (AssertRefSnapshotId(ref=ref, snapshot_id=head),)
        # else Iceberg refuses to assert a tag (none can exist yet); the snapshot's own
        # requirement (``main`` has no snapshot) says no commit came first, a fence neither
        updates = (*tx._updates, SetSnapshotRefUpdate(ref_name=ref, type=SnapshotRefType.TAG, snapshot_id=added[0]))
        faults.point("external-commit", name)
        try:
            response = _call(self.kind, lambda: self.catalog.commit_table(table, requirements, updates))
        except CommitFailedException as exc:
            now = self.load(name)
            if now is not None and _holds(now, added[0]):
                # Our own update applied and its answer was lost: botocore retried the call with
                # the VersionId our update had just made stale. Committed: its files must stay.
                log.info("table %s: commit of %s refused on retry, but the table holds its snapshot: committed",
                         name, write_id[:12])
                self._retire_superseded(name, table, now.metadata)
                return added[0]
            if now is not None and _ref(now, ref) != head:
                raise FenceMoved(f"table {name}: fence {ref} moved while the commit was made ({_short(exc)})") from None
            raise TableConflict(f"table {name} changed since the commit was staged ({_short(exc)})") from None
        self._retire_superseded(name, table, response.metadata)
        return added[0]

    def _retire_superseded(self, name: str, base: Table, new) -> None:
        """After a commit: what only the versions before it needed goes after the readers'
        grace. Never raises: the commit happened, and an error here must not make it look
        failed (its files would be discarded); what is left is orphan clean-up's."""
        try:
            self.retired.retire(retention.superseded(base.metadata, new, _ManifestReader(base.io)))
        except Exception as exc:  # noqa: BLE001
            log.warning("table %s: files the commit unreferenced not retired (%s); left for orphan clean-up",
                        name, exc)


@dataclass(frozen=True)
class ExternalCommit:
    """A staged change of a table in the lake's catalog, committed by ``commit()``: the
    shape of ``catalog.TableCommit`` that compaction reads (table, expected, staged)."""

    table: str
    expected: str
    staged: Table | None = field(compare=False, repr=False)
    write_id: str | None = None
    commit: Callable[[], None] = field(default=lambda: None, compare=False, repr=False)
    external: bool = True
    new: str | None = None
    files: tuple[str, ...] = ()
    superseded: tuple[str, ...] = ()


def _empty_snapshot(tx: _Transaction, kind: str) -> None:
    """An empty append to ``main`` named for the write (``reconciler.operation``): no batch's
    ranges, so ``verify`` passes over it as over a compaction's."""
    from reconciler.table.catalog import tagged
    from reconciler.table.summary import OPERATION

    with tagged(tx.update_snapshot(snapshot_properties={OPERATION: kind}).fast_append(), tx):
        pass


def _holds(table: Table, snapshot_id: int) -> bool:
    """Whether ``snapshot_id`` is in the table's history: ids are random, never reused, so
    only our own commit can have put it there."""
    return table.metadata.snapshot_by_id(snapshot_id) is not None


def _ref(table: Table, ref: str) -> int | None:
    found = table.metadata.refs.get(ref)
    return found.snapshot_id if found is not None else None


def _call(kind: str, fn):
    """``fn()``, with a catalog that does not answer turned into ``CatalogUnreachable``."""
    try:
        return fn()
    except (CommitFailedException, NoSuchTableError, TableAlreadyExistsError, NamespaceAlreadyExistsError):
        raise
    except (ConnectionError, TimeoutError, OSError) as exc:
        raise CatalogUnreachable(f"setting catalog: the {kind} catalog did not answer ({_short(exc)})") from None
    except Exception as exc:
        if type(exc).__module__.startswith(("botocore", "urllib3", "requests")):
            raise CatalogUnreachable(f"setting catalog: the {kind} catalog refused or did not answer "
                                     f"({type(exc).__name__}: {_short(exc)})") from None
        raise


def _short(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300]
