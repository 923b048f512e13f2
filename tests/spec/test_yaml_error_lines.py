"""A YAML typo is reported on the line where it is, not where PyYAML noticed it (issue 46,
the newcomer's third look): a plain value that runs on into the next line's key is only
found wrong one line later."""

from __future__ import annotations

from pathlib import Path

import pytest

from reconciler.errors import SpecInvalid
from reconciler.spec.yamlsafe import parse_yaml

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "clicks.yaml"


def _problem(text: str):
    with pytest.raises(SpecInvalid) as info:
        parse_yaml(text.encode(), "kafka-clicks.yaml")
    (problem,) = info.value.problems
    return problem


def test_the_quick_starts_spec_with_a_missing_colon_on_line_8_is_reported_on_line_8():
    lines = EXAMPLE.read_text().splitlines(keepends=True)
    assert lines[7] == "  topic: clicks\n"  # the newcomer's line 8
    lines[7] = "  topic clicks\n"
    problem = _problem("".join(lines))
    assert (problem.line, problem.column) == (8, 3)
    assert str(problem).startswith("kafka-clicks.yaml:8:3: malformed YAML: could not find expected ':'")
    assert "noticed on line 9" in problem.message


def test_a_value_that_runs_on_into_the_next_lines_key_is_reported_where_it_starts():
    problem = _problem("id: clicks\nsource:\n  topic clicks\n  type: kafka\n")
    assert (problem.line, problem.column) == (3, 3)
    problem = _problem("source:\n  topic:\n    clicks other\n    type: kafka\n")
    assert (problem.line, problem.column) == (3, 5)
    assert "mapping values are not allowed here" in problem.message
    assert "runs on to line 4" in problem.message


def test_an_error_on_its_own_line_keeps_its_position():
    problem = _problem("id: clicks\nsource: [kafka\n")
    assert problem.line == 3  # the end of the stream, where the ']' is missing
    problem = _problem("a: b: c\n")
    assert (problem.line, problem.column) == (1, 5)
