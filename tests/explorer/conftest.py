"""The schedule explorer's figures in pytest's terminal summary: each random part's
count, elapsed seconds and faults, as ``test_explorer.test_random_schedules`` recorded
them (``record_property("explorer", ...)``)."""

from __future__ import annotations

import json


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    parts = [value for reports in terminalreporter.stats.values() for r in reports
             for name, value in getattr(r, "user_properties", ()) if name == "explorer" and r.when == "call"]
    if not parts:
        return
    terminalreporter.section("schedule explorer")
    for part in parts:
        terminalreporter.write_line(json.dumps(part))
    schedules = sum(p["schedules"] for p in parts)
    seconds = sum(p["seconds"] for p in parts)
    failed = sum(p["failed"] for p in parts)
    terminalreporter.write_line(f"random schedules: {schedules} in {seconds:.0f} s, {failed} failed")
