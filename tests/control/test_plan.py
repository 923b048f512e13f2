"""The planner as a pure function: named cases of desired (files) x actual (database).

Everything here is built from the frozen dataclasses directly; nothing touches a
database, a directory or a broker.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import pytest

from reconciler.control.actual import ActualState, DetailedState, Kind, State, SupervisorRecord
from reconciler.control.plan import (
    Action,
    ActionKind,
    Desired,
    Plan,
    PlanSettings,
    desired_from_directory,
    plan,
    source_change_error,
)
from reconciler.control.requests import (
    ResetRequest,
    from_cli,
    from_marker,
    from_stanza,
    stanza_token,
)
from reconciler.control.resets import Positions
from reconciler.model import Marker, Position, SupervisorSpec
from reconciler.spec.loader import DirectoryState

NOW = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)
BAD = "specs/{sid}.yaml:8:3: source.topc: unknown key (did you mean 'topic'?)"

# --------------------------------------------------------------------------- builders


def document(sid: str, **over: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "id": sid,
        "source": {"type": "kafka", "bootstrapServers": "127.0.0.1:9092", "topic": sid},
        "dataSchema": {"datasource": sid.replace("-", "_"), "timestamp": {"column": "ts"}},
    }
    for key, value in over.items():
        if key == "topic":
            doc["source"]["topic"] = value
        else:
            doc[key] = value
    return doc


def spec(sid: str, **over: Any) -> SupervisorSpec:
    return SupervisorSpec.from_document(document(sid, **over))


def rabbit_spec(sid: str) -> SupervisorSpec:
    doc = document(sid)
    doc["source"] = {"type": "rabbitmq", "uri": "rabbitmq-stream://guest:guest@127.0.0.1:5552/%2f",
                     "streams": [f"{sid}-0"]}
    return SupervisorSpec.from_document(doc)


def record(s: SupervisorSpec | str, state: State = State.RUNNING, *, kind: Kind = Kind.MAIN,
           last_error: str | None = None, parent: str | None = None, **over: Any) -> SupervisorRecord:
    if isinstance(s, str):
        s = spec(s)
    return SupervisorRecord(
        id=s.id, kind=kind, spec_document=s.document, spec_hash=s.spec_hash, state=state,
        detailed_state=DetailedState(state), epoch=1, parent_id=parent,
        spec_path=None if kind == Kind.BACKFILL else f"specs/{s.id}.yaml", spec_error=last_error,
        end_offsets={"0": 10} if kind == Kind.BACKFILL else None, **over,
    )


def backfill_record(parent: str, n: int = 1, state: State = State.RUNNING) -> SupervisorRecord:
    return record(spec(parent, id=f"{parent}-backfill-{n}"), state, kind=Kind.BACKFILL, parent=parent)


def desired(*specs: SupervisorSpec, invalid: Mapping[str, str] | None = None, ok: bool = True,
            error: str | None = None, markers=(), rejected: Mapping[str, str] | None = None) -> Desired:
    return Desired(
        ok=ok, error=error,
        specs={s.id: (f"specs/{s.id}.yaml", s) for s in specs},
        invalid={sid: (f"specs/{sid}.yaml", err) for sid, err in (invalid or {}).items()},
        markers=tuple(markers),
        rejected_markers=dict(rejected or {}),
        marker_ids={path: path.rsplit("/", 1)[-1].split(".", 1)[0] for path in (rejected or {})},
    )


def actual(*records: SupervisorRecord, tokens=(), checkpoints=None) -> ActualState:
    return ActualState(supervisors={r.id: r for r in records}, handled_tokens=frozenset(tokens),
                       checkpoints=checkpoints or {})


LATEST = Position("latest")


def marker(sid: str, *, backfill: bool = True, token: str = "abc", reset_to: Position = LATEST,
           allow_rewind: bool = False) -> tuple[str, ResetRequest]:
    path = f"specs/{sid}.reset.yaml"
    m = Marker(supervisor_id=sid, path=path, token=token, reset_to=reset_to, backfill=backfill,
               allow_rewind=allow_rewind, reason="lag alarm")
    return path, from_marker(m)


def kinds(p: Plan) -> list[tuple[str, str]]:
    return [(str(a.kind), a.supervisor_id) for a in p.actions]


A, B, C, D = spec("a"), spec("b"), spec("c"), spec("d")
STANZA = {"request": "inc-1", "resetTo": "latest"}

# --------------------------------------------------------------------------- the matrix

CASES = [
    pytest.param(desired(A), actual(), [("create", "a")], None, id="new-file"),
    pytest.param(desired(spec("a", taskCount=3)), actual(record(A)), [("update", "a")], None, id="changed"),
    pytest.param(desired(A, B), actual(record(A), record(B)), [], None, id="unchanged"),
    pytest.param(desired(A, invalid={"b": BAD.format(sid="b")}), actual(record(A), record(B)),
                 [("mark-invalid", "b")], None, id="valid-to-invalid"),
    pytest.param(desired(A, invalid={"b": BAD.format(sid="b")}),
                 actual(record(A), record(B, last_error=BAD.format(sid="b"))), [], None,
                 id="invalid-again-is-idempotent"),
    pytest.param(desired(A, invalid={"b": "specs/b.yaml:3:1: id: other error"}),
                 actual(record(A), record(B, last_error=BAD.format(sid="b"))), [("mark-invalid", "b")], None,
                 id="invalid-with-a-new-error"),
    pytest.param(desired(invalid={"a": BAD.format(sid="a")}), actual(), [], "nothing to keep",
                 id="invalid-without-supervisor"),
    pytest.param(desired(invalid={"a": BAD.format(sid="a")}), actual(record(A, State.TERMINATED)), [],
                 "nothing to keep", id="invalid-terminated"),
    pytest.param(desired(A, B), actual(record(A), record(B, last_error=BAD.format(sid="b"))),
                 [("update", "b")], None, id="invalid-to-valid"),
    pytest.param(desired(A), actual(record(A), record(B)), [("terminate", "b")], None, id="valid-to-absent"),
    pytest.param(desired(A), actual(record(A), record(B, last_error=BAD.format(sid="b"))),
                 [("terminate", "b")], None, id="invalid-to-absent"),
    pytest.param(desired(A, B, C), actual(record(A), record(B), record(C), record(D)),
                 [("terminate", "d")], None, id="one-of-several-deleted"),
    pytest.param(desired(A, B), actual(record(A), record(B), record(C), record(D)),
                 [("terminate", "c"), ("terminate", "d")], None, id="half-deleted-is-not-over-the-share"),
    pytest.param(desired(A), actual(record(A), record(B, State.TERMINATED)), [], None, id="terminated-stays-absent"),
    pytest.param(desired(A), actual(record(A, State.TERMINATED)), [("create", "a")], None,
                 id="terminated-file-back"),
    pytest.param(desired(spec("a", suspended=True)), actual(record(A)), [("update", "a"), ("suspend", "a")],
                 None, id="suspend"),
    pytest.param(desired(A), actual(record(spec("a", suspended=True), State.SUSPENDED)),
                 [("update", "a"), ("resume", "a")], None, id="resume"),
    pytest.param(desired(spec("a", suspended=True)), actual(record(spec("a", suspended=True), State.RUNNING)),
                 [("suspend", "a")], None, id="suspended-spec-running-state"),
    pytest.param(desired(A), actual(record(A, State.SUSPENDED)), [("resume", "a")], None,
                 id="unsuspended-spec-suspended-state"),
    pytest.param(desired(spec("a", suspended=True)), actual(record(spec("a", suspended=True), State.SUSPENDED)),
                 [], None, id="suspended-stays-suspended"),
    pytest.param(desired(spec("a", topic="other")), actual(record(A)), [("mark-invalid", "a")], None,
                 id="topic-change"),
    pytest.param(desired(spec("a", topic="other")),
                 actual(record(A, last_error=source_change_error("specs/a.yaml",
                                                                 "topic changed from 'a' to 'other'"))),
                 [], None, id="topic-change-again-is-idempotent"),
    pytest.param(desired(rabbit_spec("a")), actual(record(A)), [("mark-invalid", "a")], None,
                 id="source-type-change"),
    pytest.param(desired(), actual(record(A)), [], "spec directory is empty", id="empty-directory-one"),
    pytest.param(desired(), actual(record(A), record(B), record(C)), [], "spec directory is empty",
                 id="empty-directory-many"),
    pytest.param(desired(ok=False, error="spec directory specs cannot be read: Permission denied"),
                 actual(record(A), record(B)), [], "spec directory unreadable", id="unreadable-directory"),
    pytest.param(desired(A), actual(record(A), record(B), record(C), record(D)), [],
                 "3 of 4 supervisors would terminate", id="mass-deletion"),
    pytest.param(desired(A), actual(record(A), backfill_record("a"), backfill_record("b")), [], None,
                 id="backfills-never-terminated"),
    pytest.param(desired(), actual(backfill_record("a", state=State.COMPLETED)), [], None,
                 id="only-backfills-empty-directory"),
    pytest.param(desired(spec("a", backfill=STANZA)), actual(record(spec("a", backfill=STANZA))),
                 [("reset-and-backfill", "a")], None, id="backfill-stanza-new-request"),
    pytest.param(desired(spec("a", backfill=STANZA)),
                 actual(record(spec("a", backfill=STANZA)), tokens={stanza_token("a", "inc-1")}), [], None,
                 id="backfill-stanza-handled"),
    pytest.param(desired(spec("a", backfill=STANZA | {"request": "inc-2"})),
                 actual(record(spec("a", backfill=STANZA)), tokens={stanza_token("a", "inc-1")}),
                 [("update", "a"), ("reset-and-backfill", "a")], None, id="backfill-stanza-next-request"),
    pytest.param(desired(spec("a", backfill=STANZA)), actual(record(A)),
                 [("update", "a"), ("reset-and-backfill", "a")], None, id="backfill-stanza-added"),
    pytest.param(desired(spec("a", backfill=STANZA)), actual(), [("create", "a"), ("reset-and-backfill", "a")],
                 None, id="new-file-with-backfill-stanza"),
    pytest.param(desired(A, markers=[marker("a")]), actual(record(A)), [("reset-and-backfill", "a")], None,
                 id="marker-with-backfill"),
    pytest.param(desired(A, markers=[marker("a", backfill=False)]), actual(record(A)), [("reset", "a")], None,
                 id="marker-without-backfill"),
    pytest.param(desired(A, markers=[marker("zz")]), actual(record(A)), [("reject-marker", "zz")], None,
                 id="marker-unknown-supervisor"),
    pytest.param(desired(A, markers=[marker("b")]), actual(record(A), record(B, State.TERMINATED)),
                 [("reject-marker", "b")], None, id="marker-terminated-supervisor"),
    pytest.param(desired(A, markers=[marker("a")]), actual(record(A), tokens={"marker:abc"}),
                 [("retire-marker", "a")], None, id="marker-handled"),
    pytest.param(desired(A, rejected={"specs/a.reset.yaml": "specs/a.reset.yaml:1:1: resetTo: bad"}),
                 actual(record(A)), [("reject-marker", "a")], None, id="marker-invalid"),
]


@pytest.mark.parametrize(("want", "have", "expected", "note"), CASES)
def test_plan_cases(want: Desired, have: ActualState, expected, note):
    p = plan(want, have, (), NOW)
    assert kinds(p) == expected
    if note is None:
        assert not [n for n in p.notes if "terminat" in n]
    else:
        assert any(note in n for n in p.notes), p.notes
    assert p.changes is bool(expected)
    # an invalid file, an unreadable or empty directory never terminates anything it keeps
    for a in p.actions:
        if a.kind == ActionKind.TERMINATE:
            assert a.supervisor_id not in want.invalid
            assert have.supervisors[a.supervisor_id].kind == Kind.MAIN


def test_plan_is_pure_and_leaves_inputs_alone():
    want = desired(spec("a", taskCount=2), B, markers=[marker("b")])
    have = actual(record(A), record(C), checkpoints={"a": {"0": 1}})
    before = (copy.deepcopy(dict(want.specs)), dict(have.supervisors), dict(have.checkpoints))
    first, second = plan(want, have, (), NOW), plan(want, have, (), NOW)
    assert first == second
    assert (dict(want.specs), dict(have.supervisors), dict(have.checkpoints)) == before


# --------------------------------------------------------------------------- details of actions


def test_create_carries_spec_path_and_reason():
    [a] = plan(desired(A), actual(), (), NOW).actions
    assert a == Action(ActionKind.CREATE, "a", "new spec file", spec=A, path="specs/a.yaml")
    assert a.to_dict() == {"kind": "create", "supervisor": "a", "reason": "new spec file",
                           "path": "specs/a.yaml", "specHash": A.spec_hash}


def test_terminated_file_back_says_checkpoint_kept():
    [a] = plan(desired(A), actual(record(A, State.TERMINATED)), (), NOW).actions
    assert a.reason == "spec file is back; continues from the kept checkpoint"


def test_update_reasons():
    [changed] = plan(desired(spec("a", taskCount=3)), actual(record(A)), (), NOW).actions
    [again] = plan(desired(A), actual(record(A, last_error="x")), (), NOW).actions
    assert (changed.reason, again.reason) == ("spec changed", "spec file is valid again")
    assert changed.spec.task_count == 3


def test_mark_invalid_carries_error_and_path():
    err = BAD.format(sid="a")
    [a] = plan(desired(invalid={"a": err}), actual(record(A)), (), NOW).actions
    assert a.kind == ActionKind.MARK_INVALID
    assert a.error == err
    assert a.path == "specs/a.yaml"
    assert a.spec is None  # keeps its last valid spec: nothing new to write
    assert "keeps its last valid spec" in a.reason
    assert a.to_dict()["error"] == err


def test_topic_change_error_names_both_topics():
    [a] = plan(desired(spec("a", topic="other")), actual(record(A)), (), NOW).actions
    assert a.error == ("specs/a.yaml: source: topic changed from 'a' to 'other'; the kept checkpoints belong "
                       "to the old source, so this id keeps its last valid spec. To start this id over on the new "
                       "source, add `freshStart: true` to the spec (the old checkpoints are dropped and ingestion "
                       "starts from startFrom); or use a new id; or revert the source")


def test_terminate_uses_the_recorded_path():
    [a] = plan(desired(A), actual(record(A), record(B)), (), NOW).actions
    assert (a.kind, a.supervisor_id, a.reason, a.path) == (ActionKind.TERMINATE, "b", "spec file removed",
                                                           "specs/b.yaml")


# --------------------------------------------------------------------------- termination guards


@pytest.mark.parametrize(
    ("want", "have", "held"),
    [
        pytest.param(desired(), actual(record(A), record(B)), ("a", "b"), id="empty-directory"),
        pytest.param(desired(A), actual(record(A), record(B), record(C)), ("b", "c"), id="mass-deletion"),
        pytest.param(desired(ok=False, error="gone"), actual(record(A)), ("a",), id="unreadable"),
    ],
)
def test_held_terminations_are_listed(want, have, held):
    p = plan(want, have, (), NOW)
    assert p.held_terminations == held
    assert p.to_dict()["heldTerminations"] == list(held)
    assert not [a for a in p.actions if a.kind == ActionKind.TERMINATE]


def test_mass_deletion_note_says_how_to_confirm():
    p = plan(desired(A), actual(record(A), record(B), record(C)), (), NOW)
    assert p.notes == ("2 of 3 supervisors would terminate (67% > 50%); held: b, c "
                       "(run `reconciler apply --confirm-terminations` if this is intended)",)


def test_unreadable_note_carries_the_error():
    p = plan(desired(ok=False, error="spec directory specs does not exist"), actual(record(A)), (), NOW)
    assert p.notes == ("spec directory unreadable (spec directory specs does not exist); "
                       "no termination planned for a",)


@pytest.mark.parametrize(
    ("want", "have", "terminated"),
    [
        pytest.param(desired(A), actual(record(A), record(B), record(C), record(D)), ["b", "c", "d"],
                     id="mass-deletion"),
        pytest.param(desired(), actual(record(A), record(B)), ["a", "b"], id="empty-directory"),
    ],
)
def test_confirm_terminations(want, have, terminated):
    p = plan(want, have, (), NOW, settings=PlanSettings(confirm_terminations=True))
    assert kinds(p) == [("terminate", sid) for sid in terminated]
    assert p.held_terminations == ()
    assert p.notes == ()


def test_confirm_never_overrides_an_unreadable_directory():
    p = plan(desired(ok=False, error="EIO"), actual(record(A), record(B)), (), NOW,
             settings=PlanSettings(confirm_terminations=True))
    assert p.actions == ()
    assert p.held_terminations == ("a", "b")


@pytest.mark.parametrize(
    ("share", "expected"),
    [
        pytest.param(0.5, [], id="share-0.5-holds-3-of-4"),
        pytest.param(0.75, [("terminate", "b"), ("terminate", "c"), ("terminate", "d")], id="share-0.75-allows"),
        pytest.param(0.0, [], id="share-0-holds-all-but-one"),
    ],
)
def test_max_termination_share(share, expected):
    p = plan(desired(A), actual(record(A), record(B), record(C), record(D)), (), NOW,
             settings=PlanSettings(max_termination_share=share))
    assert kinds(p) == expected


def test_single_termination_is_never_held_by_the_share():
    p = plan(desired(A), actual(record(A), record(B)), (), NOW, settings=PlanSettings(max_termination_share=0.0))
    assert kinds(p) == [("terminate", "b")]


def test_terminated_supervisors_do_not_count_toward_the_share():
    have = actual(record(A), record(B), record(C, State.TERMINATED), record(D, State.TERMINATED))
    p = plan(desired(A), have, (), NOW)
    assert kinds(p) == [("terminate", "b")]  # 1 of 2 active, not held


def test_invalid_files_are_not_counted_as_gone():
    err = BAD.format(sid="b")
    have = actual(record(A), record(B), record(C))
    p = plan(desired(invalid={"a": err, "b": err, "c": err}), have, (), NOW)
    assert [a.kind for a in p.actions] == [ActionKind.MARK_INVALID] * 3
    assert p.held_terminations == ()


# --------------------------------------------------------------------------- reset requests


def test_cli_request_planned_once():
    req = from_cli("a", Position("latest"), operation_id="op1")
    [a] = plan(desired(A), actual(record(A)), [req], NOW).actions
    assert (a.kind, a.request) == (ActionKind.RESET_AND_BACKFILL, req)
    assert plan(desired(A), actual(record(A), tokens={"cli:op1"}), [req], NOW).actions == ()


def test_stanza_request_details():
    s = spec("a", backfill={"request": "inc-7", "resetTo": "earliest", "taskCount": 4, "allowRewind": True})
    [a] = plan(desired(s), actual(record(s)), (), NOW).actions
    assert a.request == from_stanza(s)
    assert a.request.token == "stanza:a:inc-7"
    assert a.request.backfill_task_count == 4
    assert a.request.allow_rewind is True
    assert a.path == "specs/a.yaml"
    d = a.to_dict()
    assert d["request"] == {"token": "stanza:a:inc-7", "trigger": "stanza", "source": "inc-7",
                            "position": "earliest", "backfill": True, "allowRewind": True,
                            "reason": "backfill request inc-7"}


def test_marker_unknown_supervisor_names_known_ones():
    [a] = plan(desired(A, B, markers=[marker("zz")]), actual(record(A), record(B)), (), NOW).actions
    assert a.kind == ActionKind.REJECT_MARKER
    assert a.error == "specs/zz.reset.yaml: unknown supervisor 'zz' (known: a, b)"


def test_marker_for_a_spec_created_in_the_same_tick_is_planned():
    p = plan(desired(A, markers=[marker("a")]), actual(), (), NOW)
    assert kinds(p) == [("create", "a"), ("reset-and-backfill", "a")]


def test_marker_for_an_invalid_kept_supervisor_is_planned():
    p = plan(desired(invalid={"a": "x"}, markers=[marker("a")]), actual(record(A, last_error="x")), (), NOW)
    assert kinds(p) == [("reset-and-backfill", "a")]


# --------------------------------------------------------------------------- previews


POSITIONS = {"a": Positions(earliest={"0": 0, "1": 0}, latest={"0": 100, "1": 50})}


@pytest.mark.parametrize(
    ("req", "checkpoints", "rows", "backfill_records", "skipped"),
    [
        pytest.param(marker("a")[1], {"0": 40, "1": 50},
                     [("0", 40, 100, 100, 60, 0), ("1", 50, 50, 50, 0, 0)], 60, 0, id="latest-with-backfill"),
        pytest.param(marker("a", backfill=False)[1], {"0": 40, "1": 20},
                     [("0", 40, 100, 100, 0, 60), ("1", 20, 50, 50, 0, 30)], 0, 90, id="latest-without-backfill"),
        pytest.param(marker("a")[1], {"0": 40},
                     [("0", 40, 100, 100, 60, 0), ("1", 0, 50, 50, 50, 0)], 110, 0,
                     id="missing-checkpoint-starts-from-earliest"),
    ],
)
def test_reset_preview(req, checkpoints, rows, backfill_records, skipped):
    have = actual(record(A), checkpoints={"a": checkpoints})
    [a] = plan(desired(A), have, [req], NOW, positions=POSITIONS).actions
    assert a.preview is not None
    got = [(p.partition, p.checkpoint, p.latest, p.new, p.backfill, p.skipped) for p in a.preview.partitions]
    assert got == rows
    d = a.to_dict()
    assert d["backfillRecords"] == backfill_records
    assert d["skippedRecords"] == skipped
    assert d["rereadRecords"] == 0
    assert [x["partition"] for x in d["partitions"]] == ["0", "1"]


def test_preview_missing_checkpoint_with_start_from_latest():
    s = spec("a", startFrom="latest")
    [a] = plan(desired(s), actual(record(s)), [marker("a")[1]], NOW, positions=POSITIONS).actions
    assert [(p.checkpoint, p.new, p.backfill) for p in a.preview.partitions] == [(100, 100, 0), (50, 50, 0)]


def test_preview_reports_refused_rewind():
    req = marker("a", reset_to=Position("earliest"))[1]
    [a] = plan(desired(A), actual(record(A), checkpoints={"a": {"0": 40, "1": 50}}), [req], NOW,
               positions=POSITIONS).actions
    d = a.to_dict()
    assert len(d["errors"]) == 2
    assert "would read 40 records again" in d["errors"][0]


def test_preview_of_a_backfill_stanza():
    s = spec("a", backfill=STANZA)
    [a] = plan(desired(s), actual(record(s), checkpoints={"a": {"0": 90, "1": 10}}), (), NOW,
               positions=POSITIONS).actions
    assert a.preview.backfill_ranges == {"0": (90, 100), "1": (10, 50)}


def test_no_preview_without_positions_for_that_supervisor():
    have = actual(record(A), record(B), checkpoints={"a": {"0": 1, "1": 1}})
    p = plan(desired(A, B, markers=[marker("b")]), have, (), NOW, positions=POSITIONS)
    [a] = p.actions
    assert (a.kind, a.supervisor_id, a.preview) == (ActionKind.RESET_AND_BACKFILL, "b", None)
    assert "partitions" not in a.to_dict()


# --------------------------------------------------------------------------- desired_from_directory


def test_desired_from_directory():
    from reconciler.errors import SpecInvalid, SpecProblem

    bad = SpecInvalid([SpecProblem("specs/b.yaml", 3, 1, "source.topc", "unknown key")])
    bad_marker = SpecInvalid([SpecProblem("specs/c.reset.yml", 1, 1, "resetTo", "bad")])
    m = Marker(supervisor_id="a", path="specs/a.reset.yaml", token="t1")
    state = DirectoryState(path="specs", ok=True, specs={"specs/a.yaml": A}, invalid={"specs/b.yaml": bad},
                           invalid_ids={"b": "specs/b.yaml"}, markers=(m,),
                           rejected_markers={"specs/c.reset.yml": bad_marker})
    d = desired_from_directory(state)
    assert d.ok and d.error is None
    assert dict(d.specs) == {"a": ("specs/a.yaml", A)}
    assert dict(d.invalid) == {"b": ("specs/b.yaml", "specs/b.yaml:3:1: source.topc: unknown key")}
    assert [(path, r.token, r.trigger) for path, r in d.markers] == [("specs/a.reset.yaml", "marker:t1", "marker")]
    assert d.rejected_markers == {"specs/c.reset.yml": "specs/c.reset.yml:1:1: resetTo: bad"}
    assert d.marker_ids == {"specs/c.reset.yml": "c"}
    assert not d.empty


def test_desired_from_unreadable_directory():
    d = desired_from_directory(DirectoryState(path="specs", ok=False, error="spec directory specs does not exist"))
    assert (d.ok, d.error, d.empty) == (False, "spec directory specs does not exist", True)


def test_duplicate_ids_from_the_loader_keep_the_supervisor(tmp_path):
    """Two files declaring the same id are both invalid: the supervisor keeps its spec."""
    from reconciler.spec.loader import load_directory

    text = ("id: a\nsource: {type: kafka, bootstrapServers: 127.0.0.1:9092, topic: a}\n"
            "dataSchema: {datasource: a, timestamp: {column: ts}}\n")
    (tmp_path / "a.yaml").write_text(text)
    (tmp_path / "a-copy.yaml").write_text(text)
    d = desired_from_directory(load_directory(tmp_path))
    assert d.specs == {}
    assert list(d.invalid) == ["a"]
    assert "is also declared in" in d.invalid["a"][1]
    p = plan(d, actual(record(A)), (), NOW)
    assert kinds(p) == [("mark-invalid", "a")]


# --------------------------------------------------------------------------- idempotence


def effects(have: ActualState, p: Plan) -> ActualState:
    """What the applier does to the actual state, as a pure function (the model of apply)."""
    sups = dict(have.supervisors)
    tokens = set(have.handled_tokens)
    for a in p.actions:
        rec = sups.get(a.supervisor_id)
        if a.kind == ActionKind.CREATE:
            state = State.SUSPENDED if a.spec.suspended else State.PENDING
            sups[a.supervisor_id] = dataclasses.replace(record(a.spec, state), spec_path=a.path)
        elif a.kind == ActionKind.UPDATE:
            sups[a.supervisor_id] = dataclasses.replace(rec, spec_document=a.spec.document,
                                                        spec_hash=a.spec.spec_hash, spec_error=None)
        elif a.kind == ActionKind.SUSPEND:
            sups[a.supervisor_id] = dataclasses.replace(rec, state=State.SUSPENDED)
        elif a.kind == ActionKind.RESUME:
            sups[a.supervisor_id] = dataclasses.replace(rec, state=State.PENDING)
        elif a.kind == ActionKind.TERMINATE:
            sups[a.supervisor_id] = dataclasses.replace(rec, state=State.TERMINATED)
        elif a.kind == ActionKind.MARK_INVALID:
            sups[a.supervisor_id] = dataclasses.replace(rec, spec_error=a.error)
        elif a.kind in (ActionKind.RESET, ActionKind.RESET_AND_BACKFILL, ActionKind.REJECT_MARKER):
            if a.request is not None:
                tokens.add(a.request.token)
    return ActualState(supervisors=sups, handled_tokens=frozenset(tokens), checkpoints=have.checkpoints)


def retire_markers(want: Desired, p: Plan) -> Desired:
    """The applier renames consumed markers: they leave the directory."""
    done = {a.path for a in p.actions if a.kind in (ActionKind.RESET, ActionKind.RESET_AND_BACKFILL,
                                                    ActionKind.REJECT_MARKER, ActionKind.RETIRE_MARKER)}
    return dataclasses.replace(
        want, markers=tuple(m for m in want.markers if m[0] not in done),
        rejected_markers={k: v for k, v in want.rejected_markers.items() if k not in done})


def test_plan_applied_twice_equals_once():
    err = BAD.format(sid="c")
    want = desired(
        spec("a", taskCount=5),  # changed
        spec("b", suspended=True),  # suspended flip
        spec("n", backfill=STANZA),  # new, with a backfill stanza
        spec("t"),  # terminated, file back
        spec("r"),
        invalid={"c": err},  # valid -> invalid
        markers=[marker("r"), marker("zz", token="z")],  # a reset and an unknown supervisor
    )
    have = actual(record(A), record(B), record(C), record(D), record("t", State.TERMINATED), record("r"),
                  backfill_record("a"))
    first = plan(want, have, (), NOW)
    assert kinds(first) == [
        ("update", "a"), ("update", "b"), ("suspend", "b"), ("mark-invalid", "c"), ("create", "n"),
        ("reset-and-backfill", "n"), ("create", "t"), ("terminate", "d"),
        ("reset-and-backfill", "r"), ("reject-marker", "zz"),
    ]
    once = effects(have, first)
    twice = effects(once, first)
    assert twice == once
    after = retire_markers(want, first)
    assert plan(after, once, (), NOW).actions == ()
    assert plan(after, twice, (), NOW).actions == ()
    # markers whose rename failed are retired, never applied (or rejected) again
    again = plan(want, once, (), NOW)
    assert kinds(again) == [("retire-marker", "r"), ("retire-marker", "zz")]


@pytest.mark.parametrize(
    ("want", "have"),
    [pytest.param(c.values[0], c.values[1], id=c.id) for c in CASES],
)
def test_every_case_converges_in_one_pass(want: Desired, have: ActualState):
    first = plan(want, have, (), NOW)
    after = effects(have, first)
    second = plan(retire_markers(want, first), after, (), NOW)
    assert second.actions == ()
    assert effects(after, first) == after


# --------------------------------------------------------------------------- issue 10 item 3: changed source


def rabbit(sid: str, uri: str = "rabbitmq-stream://guest:${env:RMQ_PASSWORD}@127.0.0.1:5552/%2f",
           streams=("s-0", "s-1"), **over: Any) -> SupervisorSpec:
    doc = document(sid, **over)
    doc["source"] = {"type": "rabbitmq", "uri": uri, "streams": list(streams)}
    return SupervisorSpec.from_document(doc)


def kafka(sid: str, bootstrap: str = "127.0.0.1:9092", topic: str = "t", **over: Any) -> SupervisorSpec:
    doc = document(sid, **over)
    doc["source"] = {"type": "kafka", "bootstrapServers": bootstrap, "topic": topic}
    return SupervisorSpec.from_document(doc)


SOURCE_CHANGES = [
    pytest.param(kafka("a"), kafka("a", topic="u"), "topic changed from 't' to 'u'", id="kafka-topic"),
    pytest.param(kafka("a"), kafka("a", bootstrap="10.0.0.1:9092"), "cluster changed from 127.0.0.1:9092 to "
                 "10.0.0.1:9092", id="kafka-cluster"),
    pytest.param(rabbit("a"), rabbit("a", uri="rabbitmq-stream://guest:guest@10.0.0.2:5552/%2f"),
                 "RabbitMQ host changed from 127.0.0.1 to 10.0.0.2", id="rabbit-host"),
    pytest.param(rabbit("a"), rabbit("a", uri="rabbitmq-stream://guest:guest@127.0.0.1:5552/prod"),
                 "RabbitMQ vhost changed from '/' to 'prod'", id="rabbit-vhost"),
    pytest.param(rabbit("a"), rabbit("a", streams=("s-0",)),
                 "stream(s) s-1 removed from the list (their checkpoints would be dropped silently)",
                 id="rabbit-stream-removed"),
    pytest.param(kafka("a"), rabbit("a"), "type changed from kafka to rabbitmq", id="type"),
]


@pytest.mark.parametrize(("old", "new", "change"), SOURCE_CHANGES)
@pytest.mark.parametrize("state", [State.RUNNING, State.SUSPENDED, State.TERMINATED])
def test_changed_source_is_refused_on_update_and_recreate(old, new, change, state):
    [a] = plan(desired(new), actual(record(old, state)), (), NOW).actions
    assert (a.kind, a.fresh_start) == (ActionKind.MARK_INVALID, None)
    assert a.error == source_change_error("specs/a.yaml", change, terminated=state == State.TERMINATED)
    assert "freshStart: true" in a.error
    # recorded once: planning again with the error stored plans nothing
    again = plan(desired(new), actual(record(old, state, last_error=a.error)), (), NOW)
    assert again.actions == ()


@pytest.mark.parametrize(("old", "new", "change"), SOURCE_CHANGES)
@pytest.mark.parametrize("state", [State.RUNNING, State.TERMINATED])
def test_changed_source_with_fresh_start(old, new, change, state):
    fresh = SupervisorSpec.from_document({**new.document, "freshStart": True})
    [a] = plan(desired(fresh), actual(record(old, state)), (), NOW).actions
    assert a.kind == (ActionKind.CREATE if state == State.TERMINATED else ActionKind.UPDATE)
    assert a.fresh_start == change
    assert a.to_dict()["freshStart"] == change
    # once the new source is recorded, freshStart changes nothing more
    assert plan(desired(fresh), actual(record(fresh, state=State.RUNNING)), (), NOW).actions == ()


@pytest.mark.parametrize(("old", "new"), [
    pytest.param(kafka("a"), kafka("a", bootstrap="127.0.0.1:9092,127.0.0.2:9092"), id="kafka-broker-added"),
    pytest.param(rabbit("a"), rabbit("a", streams=("s-0", "s-1", "s-2")), id="rabbit-stream-added"),
    pytest.param(rabbit("a"), rabbit("a", uri="rabbitmq-stream://ops:${file:/run/pw}@127.0.0.1:5552/%2f"),
                 id="rabbit-other-credentials"),
])
def test_same_source_identity_is_an_ordinary_update(old, new):
    [a] = plan(desired(new), actual(record(old)), (), NOW).actions
    assert (a.kind, a.fresh_start) == (ActionKind.UPDATE, None)


def test_terminated_id_back_with_the_same_source_keeps_its_checkpoints():
    [a] = plan(desired(kafka("a")), actual(record(kafka("a"), State.TERMINATED)), (), NOW).actions
    assert (a.kind, a.fresh_start) == (ActionKind.CREATE, None)


# --------------------------------------------------------------------------- issue 17 item 7: same source twice


def test_two_supervisors_on_the_same_source_into_one_datasource_are_warned():
    one = kafka("one", dataSchema={"datasource": "clicks", "timestamp": {"column": "ts"}})
    two = kafka("two", dataSchema={"datasource": "clicks", "timestamp": {"column": "ts"}})
    other_ds = kafka("three", dataSchema={"datasource": "other", "timestamp": {"column": "ts"}})
    p = plan(desired(one, two, other_ds), actual(), (), NOW)
    [note] = [n for n in p.notes if n.startswith("warning:")]
    assert note == ("warning: one and two read the same source into datasource 'clicks': every record would be "
                    "ingested twice (specs/one.yaml, specs/two.yaml); remove one, or give one another datasource")


def test_other_topic_into_the_same_datasource_is_not_warned():
    one = kafka("one", dataSchema={"datasource": "clicks", "timestamp": {"column": "ts"}})
    two = kafka("two", topic="u", dataSchema={"datasource": "clicks", "timestamp": {"column": "ts"}})
    assert not [n for n in plan(desired(one, two), actual(), (), NOW).notes if n.startswith("warning:")]


# --------------------------------------------------------------------------- issue 10 item 2: added partitions


def test_preview_reads_a_partition_added_after_start_from_earliest():
    """startFrom: latest, partition 2 appeared while suspended: its records are backfilled."""
    s = spec("a", startFrom="latest", suspended=True)
    pos = {"a": Positions(earliest={"0": 0, "1": 0, "2": 0}, latest={"0": 100, "1": 50, "2": 30})}
    [a] = plan(desired(s), actual(record(s, State.SUSPENDED), checkpoints={"a": {"0": 40, "1": 50}}),
               [marker("a")[1]], NOW, positions=pos).actions
    rows = [(p.partition, p.checkpoint, p.new, p.backfill, p.skipped) for p in a.preview.partitions]
    assert rows == [("0", 40, 100, 60, 0), ("1", 50, 50, 0, 0), ("2", 0, 30, 30, 0)]
    assert a.to_dict()["skippedRecords"] == 0


def test_preview_honours_start_from_timestamp():
    """The preview fills a never-started supervisor from the captured startFrom offsets (a
    timestamp here), like the reset transaction does (issue 16)."""
    s = spec("a", startFrom={"timestamp": "2026-11-20T10:00:00Z"})
    pos = {"a": Positions(earliest={"0": 0, "1": 0}, latest={"0": 100, "1": 50}, start_from={"0": 70, "1": 20})}
    [a] = plan(desired(s), actual(record(s)), [marker("a")[1]], NOW, positions=pos).actions
    assert [(p.checkpoint, p.backfill) for p in a.preview.partitions] == [(70, 30), (20, 30)]


def test_no_preview_of_start_from_timestamp_without_its_offsets():
    """Positions handed in without the startFrom offsets: no preview, never one filled from earliest."""
    s = spec("a", startFrom={"timestamp": "2026-11-20T10:00:00Z"})
    pos = {"a": Positions(earliest={"0": 0, "1": 0}, latest={"0": 100, "1": 50})}
    [a] = plan(desired(s), actual(record(s)), [marker("a")[1]], NOW, positions=pos).actions
    assert a.preview is None


def test_preview_of_a_partition_gone_is_an_error():
    pos = {"a": Positions(earliest={"0": 0}, latest={"0": 100})}
    [a] = plan(desired(A), actual(record(A), checkpoints={"a": {"0": 40, "1": 50}}), [marker("a")[1]], NOW,
               positions=pos).actions
    [error] = a.to_dict()["errors"]
    assert error.startswith("partition(s) 1 have a checkpoint but the source no longer has them")


# --------------------------------------------------------------------------- issue 28 item 7: rollup flipped


@pytest.mark.parametrize("state", [State.RUNNING, State.TERMINATED])
@pytest.mark.parametrize(("before", "after"), [(False, True), (True, False)])
def test_a_spec_that_turns_rollup_on_or_off_for_its_datasource_is_refused(state, before, after):
    def with_rollup(rollup: bool) -> SupervisorSpec:
        doc = document("a")
        doc["dataSchema"]["granularity"] = {"segment": "hour", "query": "none", "rollup": rollup}
        doc["dataSchema"]["metrics"] = [{"name": "count", "type": "count"}]
        return SupervisorSpec.from_document(doc)

    [a] = plan(desired(with_rollup(after)), actual(record(with_rollup(before), state)), (), NOW).actions
    assert a.kind == ActionKind.MARK_INVALID
    assert f"rollup: changed from {str(before).lower()} to {str(after).lower()}" in a.error
    assert "new datasource" in a.error
    # recorded once; a spec that also moves to another datasource is an ordinary update
    assert plan(desired(with_rollup(after)), actual(record(with_rollup(before), state, last_error=a.error)),
                (), NOW).actions == ()
    moved = with_rollup(after).document | {"dataSchema": {**with_rollup(after).document["dataSchema"],
                                                           "datasource": "elsewhere"}}
    [b] = plan(desired(SupervisorSpec.from_document(moved)), actual(record(with_rollup(before), state)),
               (), NOW).actions
    assert b.kind in (ActionKind.UPDATE, ActionKind.CREATE)
