"""Reset arithmetic (``compute_reset``): where each checkpoint goes and what a backfill covers."""

from __future__ import annotations

import pytest

from reconciler.control.resets import (
    PartitionReset,
    Positions,
    compute_reset,
    fill_from,
    start_offsets,
)
from reconciler.model import Position

# Two partitions: "0" has records [0, 100), "1" has [10, 60).
POS = Positions(earliest={"0": 0, "1": 10}, latest={"0": 100, "1": 60})


def parts(outcome) -> dict[str, PartitionReset]:
    return {p.partition: p for p in outcome.partitions}


@pytest.mark.parametrize(
    ("backfill", "expect_backfill", "expect_skipped"),
    [
        pytest.param(True, {"0": 60, "1": 10}, {"0": 0, "1": 0}, id="with-backfill"),
        pytest.param(False, {"0": 0, "1": 0}, {"0": 60, "1": 10}, id="without-backfill"),
    ],
)
def test_latest_moves_forward(backfill, expect_backfill, expect_skipped):
    out = compute_reset(Position("latest"), {"0": 40, "1": 50}, POS, backfill=backfill)
    assert out.ok
    assert out.new_offsets == {"0": 100, "1": 60}
    by = parts(out)
    assert {p: by[p].backfill for p in by} == expect_backfill
    assert {p: by[p].skipped for p in by} == expect_skipped
    assert all(p.reread == 0 for p in out.partitions)
    assert out.changed
    if backfill:
        assert out.backfill_ranges == {"0": (40, 100), "1": (50, 60)}
        assert out.backfill_records == 70
        assert out.warnings == ()
    else:
        assert out.backfill_ranges == {}
        assert out.backfill_records == 0
        assert out.warnings == ("no backfill: 70 records will be skipped",)


def test_latest_below_checkpoint_keeps_checkpoint():
    """A broker that under-reports its end (Tansu) must not move a checkpoint back."""
    under = Positions(earliest={"0": 0, "1": 0}, latest={"0": 90, "1": 60})
    out = compute_reset(Position("latest"), {"0": 95, "1": 40}, under, backfill=True)
    assert out.ok, out.errors
    assert out.new_offsets == {"0": 95, "1": 60}
    by = parts(out)
    assert (by["0"].backfill, by["0"].skipped, by["0"].reread) == (0, 0, 0)
    assert by["1"].backfill == 20
    assert out.backfill_ranges == {"1": (40, 60)}


def test_latest_at_checkpoint_changes_nothing():
    out = compute_reset(Position("latest"), {"0": 100, "1": 60}, POS, backfill=True)
    assert out.ok
    assert not out.changed
    assert out.backfill_ranges == {}
    assert out.warnings == ()


def test_earliest_rewind_refused_without_allow_rewind():
    out = compute_reset(Position("earliest"), {"0": 40, "1": 50}, POS, backfill=True)
    assert not out.ok
    assert out.errors == (
        "partition 0: moving the checkpoint back from 40 to 0 would read 40 records again; "
        "ask for it explicitly (allowRewind: true / --allow-rewind)",
        "partition 1: moving the checkpoint back from 50 to 10 would read 40 records again; "
        "ask for it explicitly (allowRewind: true / --allow-rewind)",
    )
    assert out.new_offsets == {"0": 40, "1": 50}  # refused partitions keep their checkpoint
    assert not out.changed


def test_earliest_rewind_allowed_counts_reread():
    out = compute_reset(Position("earliest"), {"0": 40, "1": 50}, POS, backfill=True, allow_rewind=True)
    assert out.ok
    assert out.new_offsets == {"0": 0, "1": 10}
    by = parts(out)
    assert (by["0"].reread, by["1"].reread) == (40, 40)
    assert out.backfill_records == 0
    assert out.warnings == ("rewind: 80 records will be read again (duplicates by request)",)


def test_earliest_when_checkpoint_is_before_earliest_moves_forward():
    """Retention deleted records below the checkpoint: earliest is a forward jump."""
    out = compute_reset(Position("earliest"), {"0": 0, "1": 0}, POS, backfill=True)
    assert out.ok
    assert out.new_offsets == {"0": 0, "1": 10}
    # [0, 10) of partition 1 no longer exists: lost (reported), never a backfill of a deleted range
    assert out.backfill_ranges == {}
    assert out.lost_ranges == {"1": (0, 10)}
    assert out.lost_records == 10
    assert out.warnings == ("retention: 10 records were deleted by the broker before they were ingested "
                            "and are lost (1: [0, 10))",)


@pytest.mark.parametrize(
    ("offsets", "checkpoint", "new", "allow_rewind", "errors"),
    [
        pytest.param({"0": 70}, {"0": 40, "1": 50}, {"0": 70, "1": 50}, False, (), id="forward-one-partition"),
        pytest.param({"0": 100, "1": 10}, {"0": 100, "1": 10}, {"0": 100, "1": 10}, False, (), id="at-bounds"),
        pytest.param({"0": 20}, {"0": 40, "1": 50}, {"0": 20, "1": 50}, True, (), id="back-allowed"),
        pytest.param(
            {"0": 101}, {"0": 40, "1": 50}, {"0": 40, "1": 50}, False,
            ("partition 0: offset 101 is outside the valid range [0, 100]",), id="above-latest",
        ),
        pytest.param(
            {"1": 5}, {"0": 40, "1": 50}, {"0": 40, "1": 50}, True,
            ("partition 1: offset 5 is outside the valid range [10, 60]",), id="below-earliest",
        ),
        pytest.param(
            {"7": 1}, {"0": 40, "1": 50}, {"0": 40, "1": 50}, False,
            ("unknown partition(s) 7; the source has 0, 1",), id="unknown-partition",
        ),
    ],
)
def test_offsets(offsets, checkpoint, new, allow_rewind, errors):
    out = compute_reset(Position("offsets", offsets=offsets), checkpoint, POS, backfill=True,
                        allow_rewind=allow_rewind)
    assert out.errors == errors
    assert out.ok is (not errors)
    assert out.new_offsets == new


def test_offsets_forward_backfills_the_gap():
    out = compute_reset(Position("offsets", offsets={"0": 70}), {"0": 40, "1": 50}, POS, backfill=True)
    assert out.backfill_ranges == {"0": (40, 70)}
    assert out.backfill_records == 30


@pytest.mark.parametrize(
    ("shift", "allow_rewind", "new", "backfill", "reread", "warning"),
    [
        pytest.param(5, False, {"0": 45, "1": 55}, 10, 0, None, id="forward"),
        pytest.param(-5, True, {"0": 35, "1": 45}, 0, 10, None, id="back-allowed"),
        pytest.param(1000, False, {"0": 100, "1": 60}, 70, 0,
                     "partition 0: shift to 1040 clamped to 100 (valid range [0, 100])", id="clamped-high"),
        pytest.param(-1000, True, {"0": 0, "1": 10}, 0, 80,
                     "partition 1: shift to -950 clamped to 10 (valid range [10, 60])", id="clamped-low"),
    ],
)
def test_shift_by(shift, allow_rewind, new, backfill, reread, warning):
    out = compute_reset(Position("shiftBy", shift=shift), {"0": 40, "1": 50}, POS, backfill=True,
                        allow_rewind=allow_rewind)
    assert out.ok, out.errors
    assert out.new_offsets == new
    assert out.backfill_records == backfill
    assert sum(p.reread for p in out.partitions) == reread
    if warning:
        assert warning in out.warnings


def test_shift_back_refused_without_allow_rewind():
    out = compute_reset(Position("shiftBy", shift=-5), {"0": 40, "1": 50}, POS, backfill=True)
    assert not out.ok
    assert len(out.errors) == 2
    assert out.errors[0].startswith("partition 0: moving the checkpoint back from 40 to 35 would read 5 records")


def test_timestamp_uses_for_time():
    pos = Positions(earliest=POS.earliest, latest=POS.latest, for_time={"0": 80, "1": 30})
    out = compute_reset(Position("timestamp", timestamp="2026-11-20T10:00:00Z"), {"0": 40, "1": 50}, pos,
                        backfill=True)
    assert not out.ok  # partition 1 would move back from 50 to 30
    assert out.errors == (
        "partition 1: moving the checkpoint back from 50 to 30 would read 20 records again; "
        "ask for it explicitly (allowRewind: true / --allow-rewind)",
    )
    allowed = compute_reset(Position("timestamp", timestamp="2026-11-20T10:00:00Z"), {"0": 40, "1": 50}, pos,
                            backfill=True, allow_rewind=True)
    assert allowed.ok
    assert allowed.new_offsets == {"0": 80, "1": 30}
    assert allowed.backfill_ranges == {"0": (40, 80)}
    assert parts(allowed)["1"].reread == 20


def test_partitions_in_numeric_then_name_order():
    pos = Positions(earliest={"10": 0, "2": 0, "b": 0, "a": 0}, latest={"10": 5, "2": 5, "b": 5, "a": 5})
    out = compute_reset(Position("latest"), {"10": 0, "2": 0, "b": 0, "a": 0}, pos, backfill=True)
    assert [p.partition for p in out.partitions] == ["2", "10", "a", "b"]


def test_to_dict_fields():
    out = compute_reset(Position("latest"), {"0": 40, "1": 60}, POS, backfill=True)
    assert out.partitions[0].to_dict() == {
        "partition": "0", "checkpoint": 40, "earliest": 0, "latest": 100, "new": 100,
        "backfill": 60, "skipped": 0, "reread": 0, "lost": 0, "renewed": 0,
    }


def test_renew_a_rewind_of_a_source_that_started_over_reads_new_records_once():
    """Issue 46: the advised rewind after a topic was re-created said "read again (duplicates)"."""
    from reconciler.control.resets import renew

    pos = Positions(earliest={"0": 0, "1": 0}, latest={"0": 20, "1": 20})
    to = Position("offsets", offsets={"0": 0, "1": 0})
    plain = compute_reset(to, {"0": 15, "1": 15}, pos, backfill=True, allow_rewind=True)
    assert plain.warnings == ("rewind: 30 records will be read again (duplicates by request)",)
    out = renew(plain, "the topic was deleted and created again", "clicks@1")
    assert [(p.reread, p.renewed, p.new) for p in out.partitions] == [(0, 15, 0), (0, 15, 0)]
    assert out.warnings == ("the source started over (the topic was deleted and created again): the 30 records "
                            "below the checkpoints are new ones, read once in a new source generation (clicks@1); "
                            "nothing is read twice",)
    refused = renew(compute_reset(to, {"0": 15, "1": 15}, pos, backfill=True), "re-created", "clicks@1")
    assert not refused.ok and all("again" not in e and "new ones of the new source" in e for e in refused.errors)
    forward = compute_reset(Position("latest"), {"0": 5, "1": 5}, pos, backfill=True)
    assert renew(forward, "re-created", "clicks@1") == forward  # nothing below a checkpoint: unchanged


# --------------------------------------------------------------------------- filling missing checkpoints (issue 16)

CAPTURED = Positions(earliest={"0": 0, "1": 0}, latest={"0": 100, "1": 50})
TIMESTAMP = Position("timestamp", timestamp="2026-11-20T10:00:00Z")


@pytest.mark.parametrize(
    ("start_from", "filled"),
    [
        (Position("earliest"), {"0": 0, "1": 0}),
        (Position("latest"), {"0": 100, "1": 50}),
    ],
)
def test_fill_from_a_never_started_supervisor_follows_start_from(start_from, filled):
    assert fill_from({}, CAPTURED, start_from) == filled


def test_fill_from_honours_captured_start_from_timestamp_offsets():
    pos = Positions(CAPTURED.earliest, CAPTURED.latest, start_from={"0": 70, "1": 20})
    assert start_offsets(TIMESTAMP, pos) == {"0": 70, "1": 20}
    assert fill_from({}, pos, TIMESTAMP) == {"0": 70, "1": 20}


def test_fill_from_never_guesses_a_timestamp_it_was_not_given():
    assert start_offsets(TIMESTAMP, CAPTURED) is None
    with pytest.raises(ValueError, match="not captured"):
        fill_from({}, CAPTURED, TIMESTAMP)
    # once started, startFrom no longer matters: a new partition is read from earliest
    assert fill_from({"0": 40}, CAPTURED, TIMESTAMP) == {"0": 40, "1": 0}
