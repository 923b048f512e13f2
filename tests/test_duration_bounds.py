"""Issue 41.1: every duration, in a spec or a setting, is bounded by ``MAX_DURATION`` (ten years),
so that adding it to ``datetime.now()`` or to a monotonic clock never overflows: the parser
refuses longer ones, and so do the settings, whether written as a duration or as seconds."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta

import pytest

from reconciler import settings as settings_mod
from reconciler.errors import PermanentError
from reconciler.model import MAX_DURATION, DurationOutOfRange, LagPolicy, parse_duration


def test_the_bound_adds_to_now_and_to_a_monotonic_clock():
    assert parse_duration("87600h") == MAX_DURATION == 315_360_000.0
    assert datetime.now(UTC) + timedelta(seconds=MAX_DURATION) > datetime.now(UTC)
    assert 1e12 + MAX_DURATION > 1e12


@pytest.mark.parametrize("text", ["87601h", "100000000h", "315360000001ms", "9" * 400 + "s"])
def test_the_parser_refuses_longer(text):
    with pytest.raises(DurationOutOfRange, match="too long: at most 87600h"):
        parse_duration(text)
    with pytest.raises(ValueError, match="too long"):
        LagPolicy.from_document({"maxRecords": 10, "for": text})


@pytest.mark.parametrize(("value", "message"), [
    ("100000000h", "setting lag_interval: '100000000h' is too long: at most 87600h (10 years)"),
    ("1e300", "setting lag_interval: '1e300' is out of range: at most 315360000 seconds (87600h (10 years))"),
    ("inf", "setting lag_interval: 'inf' is out of range: at most 315360000 seconds (87600h (10 years))"),
    ("nan", "setting lag_interval: 'nan' is out of range: at most 315360000 seconds (87600h (10 years))"),
])
def test_a_setting_beyond_the_bound_is_refused(value, message):
    with pytest.raises(PermanentError) as exc:
        settings_mod.load({}, config=os.devnull, env={"RECONCILER_LAG_INTERVAL": value})
    assert str(exc.value) == message


def test_a_setting_at_the_bound_is_kept():
    s = settings_mod.load({}, config=os.devnull, env={"RECONCILER_COMPACT_INTERVAL": "87600h"})
    assert s.compact_interval == MAX_DURATION
