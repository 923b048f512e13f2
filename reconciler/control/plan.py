"""The planner: a pure diff of desired state (files) against actual state (database).

``plan(desired, actual, requests, now)`` returns typed actions and notes. It does no
I/O: no database, filesystem, broker, Spark or clock (``now`` is handed in). The
daemon's tick, ``reconciler plan`` and ``reconciler apply`` call this same function.

Safety rules live here, where they can be tested exhaustively:

* an invalid file never terminates its supervisor: it keeps its last valid spec;
* an unreadable or empty spec directory plans no termination;
* a tick that would terminate more than ``max_termination_share`` of the supervisors
  active once its creates are applied (and more than one) plans none, and says how to
  confirm;
* a reset request is planned once per token (stanza request id, marker hash, CLI op);
* a changed source identity (topic, cluster, RabbitMQ host/vhost, streams removed) is
  never combined with old checkpoints, on update or re-create, unless the spec says
  ``freshStart: true``: then the action carries ``fresh_start`` and apply drops them;
* two supervisors reading the same source into the same datasource get a warning note;
* a ``lagPolicy`` acts on the lag it is handed (``lag``, observed and persisted by the daemon):
  ``control.lagpolicy`` decides, and a due breach becomes an ordinary reset action whose
  request (trigger ``policy``) carries a token derived from the breach, so it is planned once.
  Each policy's status is in ``Plan.policies``, what ``reconciler plan`` shows.
* one spec never stops the others: whatever planning one supervisor raises (a value no
  check foresaw, a stored spec from an older version) becomes a ``mark-invalid`` action
  on that supervisor naming file and reason, and the plan goes on for the others.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from reconciler.control.actual import ActualState, State, SupervisorRecord
from reconciler.control.lagpolicy import LagState, PolicyDecision, decide_all
from reconciler.control.requests import ResetRequest, from_marker, from_stanza
from reconciler.control.resets import Positions, ResetOutcome, compute_reset, fill_from, renew
from reconciler.errors import printable
from reconciler.model import (
    KafkaSource,
    Position,
    RabbitSource,
    Source,
    SupervisorSpec,
    file_stem,
)
from reconciler.spec.uris import identity as uri_identity


class ActionKind(enum.StrEnum):
    CREATE = "create"
    UPDATE = "update"
    SUSPEND = "suspend"
    RESUME = "resume"
    TERMINATE = "terminate"
    RESET = "reset"
    RESET_AND_BACKFILL = "reset-and-backfill"
    MARK_INVALID = "mark-invalid"
    REJECT_MARKER = "reject-marker"
    RETIRE_MARKER = "retire-marker"  # already applied (or rejected), but the file could not be renamed


@dataclass(frozen=True)
class Action:
    kind: ActionKind
    supervisor_id: str
    reason: str
    spec: SupervisorSpec | None = None
    path: str | None = None
    request: ResetRequest | None = None
    preview: ResetOutcome | None = None
    error: str | None = None
    fresh_start: str | None = None  # create/update: the source identity changed this way; drop old checkpoints

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"kind": str(self.kind), "supervisor": self.supervisor_id, "reason": self.reason}
        if self.path:
            d["path"] = self.path
        if self.spec is not None:
            d["specHash"] = self.spec.spec_hash
        if self.request is not None:
            r = self.request
            d["request"] = {"token": r.token, "trigger": r.trigger, "source": r.source, "position": r.position.to_document(),
                            "backfill": r.backfill, "allowRewind": r.allow_rewind, "reason": r.reason}
        if self.preview is not None:
            p = self.preview
            d["partitions"] = [x.to_dict() for x in p.partitions]
            d["backfillRecords"] = p.backfill_records
            d["skippedRecords"] = sum(x.skipped for x in p.partitions)
            d["rereadRecords"] = sum(x.reread for x in p.partitions)
            if p.warnings:
                d["warnings"] = list(p.warnings)
            if p.errors:
                d["errors"] = list(p.errors)
            if p.lost_records:
                d["lostRecords"] = p.lost_records
        if self.error:
            d["error"] = self.error
        if self.fresh_start:
            d["freshStart"] = self.fresh_start
        return d


@dataclass(frozen=True)
class PlanSettings:
    max_termination_share: float = 0.5  # of active main supervisors, when more than one would go
    confirm_terminations: bool = False  # the operator confirmed a held mass termination


@dataclass(frozen=True)
class Plan:
    actions: tuple[Action, ...]
    notes: tuple[str, ...] = ()
    held_terminations: tuple[str, ...] = ()
    policies: tuple[PolicyDecision, ...] = ()  # every lagPolicy's status, due or not

    @property
    def changes(self) -> bool:
        return bool(self.actions)

    def to_dict(self) -> dict[str, Any]:
        d = {"actions": [a.to_dict() for a in self.actions], "notes": list(self.notes),
             "heldTerminations": list(self.held_terminations)}
        if self.policies:  # only with a lagPolicy: the document is unchanged for specs without one
            d["policies"] = [p.to_dict() for p in self.policies]
        return d


@dataclass(frozen=True)
class Desired:
    """What the planner needs from the spec directory (built from the loader's DirectoryState)."""

    ok: bool
    error: str | None
    specs: Mapping[str, tuple[str, SupervisorSpec]]  # id -> (path, spec)
    invalid: Mapping[str, tuple[str, str]]  # id -> (path, error text)
    markers: Sequence[tuple[str, ResetRequest]] = ()  # (path, request)
    rejected_markers: Mapping[str, str] = field(default_factory=dict)  # path -> error text
    marker_ids: Mapping[str, str] = field(default_factory=dict)  # path of a rejected marker -> supervisor id
    invalid_paths: Mapping[str, str] = field(default_factory=dict)  # every invalid spec file -> error text
    hint: str | None = None  # no spec here, but YAML files one level down (the loader's nested_hint)

    @property
    def empty(self) -> bool:
        return not self.specs and not self.invalid


def desired_from_directory(state) -> Desired:
    """Adapt the loader's ``DirectoryState`` (duck-typed to keep this module import-light)."""
    specs = {spec.id: (path, spec) for path, spec in state.specs.items()}
    invalid = {sid: (path, str(state.invalid[path])) for sid, path in state.invalid_ids.items() if path in state.invalid}
    markers = [(m.path, from_marker(m)) for m in state.markers]
    rejected = {path: str(err) for path, err in state.rejected_markers.items()}
    marker_ids = {path: file_stem(path) for path in rejected}
    invalid_paths = {path: str(err) for path, err in state.invalid.items()}
    return Desired(ok=state.ok, error=getattr(state, "error", None), specs=specs, invalid=invalid,
                   markers=markers, rejected_markers=rejected, marker_ids=marker_ids,
                   invalid_paths=invalid_paths, hint=getattr(state, "hint", None))


def plan(
    desired: Desired,
    actual: ActualState,
    requests: Sequence[ResetRequest] = (),
    now: datetime | None = None,
    *,
    positions: Mapping[str, Positions] | None = None,
    settings: PlanSettings | None = None,
    lag: Mapping[str, LagState] | None = None,
) -> Plan:
    """Diff desired against actual; return the actions that make them agree, in order.

    ``lag``: the observed lag of supervisors with a ``lagPolicy`` (``now`` is needed with it:
    time-dependent positions arrive resolved in ``positions``, but a breach's ``for`` and a
    policy's cooldown are measured against ``now``)."""
    settings = settings or PlanSettings()
    actions: list[Action] = []
    notes: list[str] = []
    mains = actual.mains()
    invalid = _invalid_by_id(desired, mains)

    for sid in sorted(set(desired.specs) | set(invalid)):
        if sid in desired.specs:
            path, spec = desired.specs[sid]
            actions += _isolated(sid, path, mains.get(sid), notes, _diff_valid, spec, path, mains.get(sid), actual)
        else:
            path, error = invalid[sid]
            rec = mains.get(sid)
            if rec is None or rec.state == State.TERMINATED:
                notes.append(f"{path}: invalid, and no supervisor '{sid}' runs from it: nothing to keep")
            elif rec.spec_error != error:
                actions.append(Action(ActionKind.MARK_INVALID, sid, f"{path} is invalid; keeps its last valid spec",
                                      path=path, error=error))

    notes += _shared_sources(desired)
    notes += [desired.hint] if desired.hint else []
    notes += [f"{sid}: {ov.describe()}; drift from the file until `reconciler resume {sid}`"
              for sid, ov in sorted(actual.overrides.items()) if sid in mains]
    terminate, held, why = _terminations(desired, mains, settings, invalid)
    actions += terminate
    if why:
        notes.append(why)

    known = {sid for sid, r in mains.items() if r.state != State.TERMINATED} | set(desired.specs)
    actions += _marker_actions(desired, actual, known)
    for req in requests:
        if req.token not in actual.handled_tokens:
            actions.append(_reset_action(req, None))
    policies = _policies(desired, actual, lag, now) if now is not None else []
    actions += [_reset_action(d.request, None) for d in policies if d.request is not None]

    actions = [_isolated_preview(a, actual, positions) for a in actions]
    return Plan(tuple(actions), tuple(notes), held, tuple(policies))


def _policies(desired: Desired, actual: ActualState, lag: Mapping[str, LagState] | None,
              now: datetime) -> list[PolicyDecision]:
    """The lag policies of the supervisors the files declare (a file that is invalid now keeps
    its last valid spec's policy, as it keeps the rest of it)."""
    specs = {}
    for sid, rec in actual.mains().items():
        try:
            spec = desired.specs[sid][1] if sid in desired.specs else rec.spec
        except Exception:  # noqa: BLE001 - a stored spec this version refuses: its file's mark-invalid says why
            continue
        specs[sid] = (spec, spec.suspended or sid in actual.overrides)
    return decide_all(specs, actual, lag or {}, now)


def _isolated(sid: str, path: str, rec: SupervisorRecord | None, notes: list[str], diff, *args) -> list[Action]:
    """``diff(*args)``, or, when planning this one spec raises, a ``mark-invalid`` action saying
    why (a note when there is no supervisor to keep): the others are planned all the same."""
    try:
        return diff(*args)
    except Exception as exc:  # noqa: BLE001 - one spec's surprise must not stop the plan of every other
        error = f"{printable(path)}: cannot be planned: {type(exc).__name__}: {printable(exc)}"
        if rec is None or rec.state == State.TERMINATED:
            notes.append(f"{error}; nothing is created from it")
            return []
        if rec.spec_error == error:
            return []
        return [Action(ActionKind.MARK_INVALID, sid, "cannot be planned; keeps its last valid spec",
                       path=path, error=error)]


def _isolated_preview(action: Action, actual: ActualState, positions: Mapping[str, Positions] | None) -> Action:
    """A reset's preview, or the action without one (and the reason) when computing it raises."""
    try:
        return _with_preview(action, actual, positions)
    except Exception as exc:  # noqa: BLE001 - a preview is advice; its failure is reported on the action
        return Action(action.kind, action.supervisor_id, action.reason, action.spec, action.path, action.request,
                      None, f"no preview: {type(exc).__name__}: {exc}", action.fresh_start)


def _diff_valid(spec: SupervisorSpec, path: str, rec: SupervisorRecord | None, actual: ActualState) -> list[Action]:
    out: list[Action] = []
    digest = spec.spec_hash  # an unchanged document has an unchanged source: the stored spec is not rebuilt
    change = source_change(rec.spec.source, spec.source) if rec is not None and rec.spec_hash != digest else None
    if change and not spec.fresh_start:
        error = source_change_error(path, change, terminated=rec.state == State.TERMINATED)
        if rec.spec_error != error:
            out.append(Action(ActionKind.MARK_INVALID, spec.id, "incompatible source change", path=path, error=error))
        return out
    fresh = change if change and spec.fresh_start else None
    flipped = rollup_change(rec, spec) if rec is not None and rec.spec_hash != digest else None
    if flipped:
        error = f"{path}: dataSchema.granularity.rollup: {flipped}"
        if rec.spec_error != error:
            out.append(Action(ActionKind.MARK_INVALID, spec.id, "rollup changed", path=path, error=error))
        return out
    if rec is None or rec.state == State.TERMINATED:
        why = "new spec file" if rec is None else "spec file is back; continues from the kept checkpoint"
        if fresh:
            why = f"spec file is back with another source ({fresh}); freshStart: old checkpoints dropped"
        out.append(Action(ActionKind.CREATE, spec.id, why, spec=spec, path=path, fresh_start=fresh))
    else:
        if rec.spec_hash != digest or rec.spec_error:
            why = "spec changed" if rec.spec_hash != digest else "spec file is valid again"
            if fresh:
                why = f"source changed ({fresh}); freshStart: old checkpoints dropped"
            out.append(Action(ActionKind.UPDATE, spec.id, why, spec=spec, path=path, fresh_start=fresh))
        override = actual.overrides.get(spec.id)  # an operator's suspension outranks the file
        suspended = spec.suspended or override is not None
        if suspended and rec.state != State.SUSPENDED:
            why = "suspended: true" if spec.suspended else override.describe()
            out.append(Action(ActionKind.SUSPEND, spec.id, why, spec=spec, path=path))
        elif not suspended and rec.state == State.SUSPENDED:
            out.append(Action(ActionKind.RESUME, spec.id, "suspended: false", spec=spec, path=path))
    req = from_stanza(spec)
    if req is not None and req.token not in actual.handled_tokens:
        out.append(_reset_action(req, path))
    return out


def rollup_change(rec: SupervisorRecord, spec: SupervisorSpec) -> str | None:
    """Why a spec that turns rollup on or off for the datasource it already writes is
    refused: the table holds one kind of rows, and compaction merging raw rows into
    rolled-up ones would lose their counts."""
    try:
        old = rec.spec.data_schema
    except Exception:  # noqa: BLE001 - a stored spec from an older schema: nothing to compare
        return None
    new = spec.data_schema
    if old.datasource != new.datasource or old.rollup == new.rollup:
        return None
    return (f"changed from {str(old.rollup).lower()} to {str(new.rollup).lower()}, but datasource "
            f"{new.datasource} already holds rows written with rollup: {str(old.rollup).lower()} (compaction would "
            "merge raw rows into rolled-up ones and lose their counts); write to a new datasource instead, "
            "or revert rollup. The supervisor keeps its last valid spec")


def source_change_error(path: str, change: str, *, terminated: bool = False) -> str:
    keeps = "is not re-created" if terminated else "keeps its last valid spec"
    return (f"{printable(path)}: source: {change}; the kept checkpoints belong to the old source, so this id {keeps}. "
            "To start this id over on the new source, add `freshStart: true` to the spec (the old checkpoints "
            "are dropped and ingestion starts from startFrom); or use a new id; or revert the source")


def source_change(old: Source, new: Source) -> str | None:
    """How the source identity changed, or None. Offsets belong to one stream: another
    topic, cluster, RabbitMQ host or vhost, or a stream removed from the set would make the
    kept checkpoints skip or re-read records of the new source. Streams added to the set
    are new partitions (read from earliest), not a change of identity; a Kafka cluster is
    the same while the old and new bootstrap lists share a broker address."""
    if old.type != new.type:
        return f"type changed from {old.type} to {new.type}"
    if isinstance(old, KafkaSource) and isinstance(new, KafkaSource):
        if old.topic != new.topic:
            return f"topic changed from '{old.topic}' to '{new.topic}'"
        if not _brokers(old.bootstrap_servers) & _brokers(new.bootstrap_servers):
            return f"cluster changed from {old.bootstrap_servers} to {new.bootstrap_servers}"
        return None
    if isinstance(old, RabbitSource) and isinstance(new, RabbitSource):
        (h1, v1), (h2, v2) = _rabbit_identity(old.uri), _rabbit_identity(new.uri)
        if h1 != h2:
            return f"RabbitMQ host changed from {h1} to {h2}"
        if v1 != v2:
            return f"RabbitMQ vhost changed from '{v1}' to '{v2}'"
        removed = sorted(set(old.streams) - set(new.streams))
        if removed:
            return f"stream(s) {', '.join(removed)} removed from the list (their checkpoints would be dropped silently)"
    return None


def _brokers(bootstrap: str) -> set[str]:
    return {b.strip().lower() for b in bootstrap.split(",") if b.strip()}


def _rabbit_identity(uri: str) -> tuple[str, str]:
    """(host, vhost) of a stream URI, without resolving references (pure; secrets stay unread;
    never raises: a URI that cannot be split is refused by validation, and is its own identity)."""
    return uri_identity(uri)


def _shared_sources(desired: Desired) -> list[str]:
    """Two supervisors on the same source into the same datasource ingest every record twice."""
    groups: dict[tuple, list[str]] = {}
    notes = []
    for sid, (path, spec) in sorted(desired.specs.items()):
        src = spec.source
        name = src.topic if isinstance(src, KafkaSource) else _rabbit_identity(src.uri)
        group = groups.setdefault((src.type, name, spec.data_schema.datasource), [])
        try:
            other = next((o for o in group if source_change(desired.specs[o][1].source, src) is None
                          and source_change(src, desired.specs[o][1].source) is None), None)
        except Exception:  # noqa: BLE001 - a warning's own failure warns of nothing; never stops the plan
            other = None
        if other is not None:
            notes.append(f"warning: {other} and {sid} read the same source into datasource "
                         f"'{spec.data_schema.datasource}': every record would be ingested twice "
                         f"({desired.specs[other][0]}, {path}); remove one, or give one another datasource")
        group.append(sid)
    return notes


def _invalid_by_id(desired: Desired, mains: Mapping[str, SupervisorRecord]) -> dict[str, tuple[str, str]]:
    """Invalid files by supervisor id. A broken file whose id cannot be recovered (binary
    garbage in ``a.yaml`` that declared ``id: b``) still belongs to the supervisor last
    loaded from that path: it keeps its last valid spec, it is not removed."""
    invalid = dict(desired.invalid)
    for sid, rec in mains.items():
        if sid in desired.specs or sid in invalid or rec.state == State.TERMINATED:
            continue
        if rec.spec_path is not None and rec.spec_path in desired.invalid_paths:
            invalid[sid] = (rec.spec_path, desired.invalid_paths[rec.spec_path])
    return invalid


def _terminations(desired: Desired, mains: Mapping[str, SupervisorRecord], settings: PlanSettings,
                  invalid: Mapping[str, tuple[str, str]]):
    active = [sid for sid, r in mains.items() if r.state != State.TERMINATED]
    gone = sorted(sid for sid in active if sid not in desired.specs and sid not in invalid)
    if not gone:
        return [], (), None
    if not desired.ok:
        return [], tuple(gone), (f"spec directory unreadable ({desired.error}); no termination planned "
                                 f"for {', '.join(gone)}")
    if not settings.confirm_terminations:
        if desired.empty:
            return [], tuple(gone), (f"spec directory is empty; terminating {', '.join(gone)} is held "
                                     "(restore the files, or run `reconciler apply --confirm-terminations`)")
        # Of the supervisors active once this tick's creates are applied: the share is then the
        # same on the next tick (those creates done, the terminations still pending), so a held
        # termination stays held until confirmed instead of passing one tick later.
        after = set(active) | set(desired.specs)
        share = len(gone) / len(after)
        if len(gone) > 1 and share > settings.max_termination_share:
            return [], tuple(gone), (
                f"{len(gone)} of {len(after)} supervisors would terminate ({share:.0%} > "
                f"{settings.max_termination_share:.0%}); held: {', '.join(gone)} "
                "(run `reconciler apply --confirm-terminations` if this is intended)")
    return [Action(ActionKind.TERMINATE, sid, "spec file removed", path=mains[sid].spec_path) for sid in gone], (), None


def _marker_actions(desired: Desired, actual: ActualState, known: set[str]) -> list[Action]:
    out: list[Action] = []
    for path, error in sorted(desired.rejected_markers.items()):
        out.append(Action(ActionKind.REJECT_MARKER, desired.marker_ids.get(path, "?"), "invalid marker", path=path, error=error))
    for path, req in desired.markers:
        if req.token in actual.handled_tokens:
            out.append(Action(ActionKind.RETIRE_MARKER, req.supervisor_id, "already handled; rename the file",
                              path=path, request=req))
        elif req.supervisor_id not in known:
            names = ", ".join(sorted(known)) or "none"
            out.append(Action(ActionKind.REJECT_MARKER, req.supervisor_id, "unknown supervisor", path=path, request=req,
                              error=f"{path}: unknown supervisor '{req.supervisor_id}' (known: {names})"))
        else:
            out.append(_reset_action(req, path))
    return out


def _reset_action(req: ResetRequest, path: str | None) -> Action:
    kind = ActionKind.RESET_AND_BACKFILL if req.backfill else ActionKind.RESET
    return Action(kind, req.supervisor_id, req.describe(), path=path, request=req)


def _with_preview(action: Action, actual: ActualState, positions: Mapping[str, Positions] | None) -> Action:
    """Attach the per-partition preview to reset actions when positions were handed in."""
    req = action.request
    if req is None or action.kind not in (ActionKind.RESET, ActionKind.RESET_AND_BACKFILL) or not positions:
        return action
    pos = positions.get(req.supervisor_id)
    if pos is None:
        return action
    rec = actual.supervisors.get(req.supervisor_id)
    spec = rec.spec if rec is not None else action.spec
    start_from = spec.start_from if spec is not None else Position("earliest")
    try:
        current = fill_from(actual.checkpoints.get(req.supervisor_id, {}), pos, start_from)
    except ValueError:
        return action  # startFrom: timestamp without its captured offsets: no preview rather than a wrong one
    preview = compute_reset(req.position, current, pos, backfill=req.backfill, allow_rewind=req.allow_rewind)
    if pos.started_over and rec is not None:  # as the reset transaction will (Store.apply_reset)
        preview = renew(preview, pos.started_over, f"{rec.id}@{rec.generation + 1}")
    return Action(action.kind, action.supervisor_id, action.reason, action.spec, action.path, req, preview, action.error)
