"""A YAML error's line (an adversarial review of the missing-colon rule): the "value that runs on into the next line's key"
rule also fires for a value that is legitimately wrapped over several lines and has an
unquoted ': ' in a LATER line (prose such as 'Note: ...'). That line is correctly indented and
nothing is missing on the value's first line: the only fix is to quote the value (or drop the
': '). The report moves from the ': ' (where it was before the change, and where
'a: b: c' still is) to the value's first line, possibly many lines up, and suggests two fixes
that are both wrong ("a ':' missing on this line" - it has its ':' - or "indented too deep")."""

from __future__ import annotations

import pytest

from reconciler.errors import SpecInvalid
from reconciler.spec.yamlsafe import parse_yaml


def _problem(text: str):
    with pytest.raises(SpecInvalid) as info:
        parse_yaml(text.encode(), "kafka-clicks.yaml")
    (problem,) = info.value.problems
    return problem


def test_a_colon_inside_a_wrapped_description_is_reported_where_the_colon_is():
    text = ("id: clicks\n"
            "description: Reads the clicks topic from the main cluster and writes\n"
            "  them to the analytics table every minute. The table is partitioned\n"
            "  by day and compacted nightly by the maintenance job.\n"
            "  Note: lag above an hour pages the on-call\n"
            "source:\n"
            "  type: kafka\n")
    problem = _problem(text)
    # the offending ': ' is line 5, column 7 ("  Note: ..."); a single-line value reports its ':'
    assert (problem.line, problem.column) == (5, 7), str(problem)
