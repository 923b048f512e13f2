"""Safe YAML parsing: data, positions, and every way a file can be refused."""

from __future__ import annotations

import pytest

from reconciler.errors import SpecInvalid
from reconciler.spec.yamlsafe import MAX_BYTES, ParsedYaml, format_field, parse_yaml, read_limited

SPEC = """\
id: clicks
source:
  type: kafka
  bootstrapServers: 127.0.0.1:9092
  topic: clicks
dataSchema:
  datasource: clicks
  timestamp: {column: ts}
  dimensions: [user, page]
"""

LAUGHS = """\
a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]
b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]
c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]
d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]
e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]
f: [*e, *e, *e, *e, *e, *e, *e, *e, *e, *e]
"""


def problems_of(data: bytes | str, **kwargs) -> list[str]:
    with pytest.raises(SpecInvalid) as info:
        parse_yaml(data, "specs/x.yaml", **kwargs)
    return [str(p) for p in info.value.problems]


def test_valid_spec_gives_data_and_positions():
    parsed = parse_yaml(SPEC.encode(), "specs/clicks.yaml")
    assert parsed.data["source"] == {
        "type": "kafka",
        "bootstrapServers": "127.0.0.1:9092",
        "topic": "clicks",
    }
    assert parsed.data["dataSchema"]["dimensions"] == ["user", "page"]
    assert parsed.keys[("source", "topic")] == (5, 3)
    assert parsed.values[("source", "topic")] == (5, 10)
    assert parsed.values[("dataSchema", "timestamp", "column")] == (8, 23)
    assert parsed.values[("dataSchema", "dimensions", 1)] == (9, 22)
    assert parsed.key_position(("source", "topic")) == (5, 3)
    assert parsed.value_position(("source", "nothing", "here")) == (3, 3)  # nearest ancestor


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            "t: 2026-11-20T10:00:00Z\n", {"t": "2026-11-20T10:00:00Z"}, id="timestamp-stays-text"
        ),
        pytest.param("d: 2026-11-20\n", {"d": "2026-11-20"}, id="date-stays-text"),
        pytest.param(
            "n: 1_000\nf: 1.5\nb: true\nz: ~\n",
            {"n": 1000, "f": 1.5, "b": True, "z": None},
            id="scalars",
        ),
        pytest.param(
            "offsets: {0: 5, 1: 7}\n", {"offsets": {"0": 5, "1": 7}}, id="keys-are-strings"
        ),
        pytest.param("s: !!str 123\n", {"s": "123"}, id="explicit-str-tag"),
        pytest.param("a: &x v\nb: *x\n", {"a": "v", "b": "v"}, id="small-alias"),
        pytest.param("p: ${env:X}\n", {"p": "${env:X}"}, id="reference-verbatim"),
        pytest.param("\ufeffa: 1\n", {"a": 1}, id="utf8-bom"),
    ],
)
def test_plain_values(text, expected):
    assert parse_yaml(text.encode(), "x.yaml").data == expected


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        pytest.param(
            "a: 1\nb: 2\na: 3\n",
            "specs/x.yaml:3:1: a: duplicate key 'a' (first defined on line 1)",
            id="duplicate-key",
        ),
        pytest.param(
            "s:\n  x: 1\n  x: 2\n",
            "specs/x.yaml:3:3: s.x: duplicate key 'x'",
            id="nested-duplicate",
        ),
        pytest.param(
            "x: !!python/object/apply:os.system ['echo pwned']\n",
            "specs/x.yaml:1:4: x: YAML tag !!python/object/apply:os.system is not allowed (safe YAML only)",
            id="python-object-apply",
        ),
        pytest.param(
            "!!python/object:os.system {}\n",
            "YAML tag !!python/object:os.system is not allowed",
            id="python-object-root",
        ),
        pytest.param(
            "x: !vault abc\n",
            "specs/x.yaml:1:4: x: YAML tag !vault is not allowed (safe YAML only)",
            id="custom-tag",
        ),
        pytest.param("x: !!binary aGk=\n", "YAML tag !!binary is not supported", id="binary-tag"),
        pytest.param("x: !!set {a}\n", "YAML tag !!set is not supported", id="set-tag"),
        pytest.param(
            "a: 1\n---\nb: 2\n",
            "specs/x.yaml:2:1: a second YAML document starts here",
            id="two-documents",
        ),
        pytest.param(
            "a:\n\tb: 1\n",
            "specs/x.yaml:2:1: tab character: YAML indents and separates with spaces only",
            id="tab-indent",
        ),
        pytest.param(
            "a: [1,\n",
            "specs/x.yaml:2:1: malformed YAML: expected the node content",
            id="unclosed-flow",
        ),
        pytest.param(
            "a: b: c\n",
            "specs/x.yaml:1:5: malformed YAML: mapping values are not allowed here",
            id="mapping-in-value",
        ),
        pytest.param(
            "- a\n- b\n", "specs/x.yaml:1:1: the document must be a mapping", id="list-document"
        ),
        pytest.param("just text\n", "not a single value ('just text')", id="scalar-document"),
        pytest.param("", "specs/x.yaml: file is empty", id="empty"),
        pytest.param("# only a comment\n", "specs/x.yaml: file is empty", id="only-comments"),
        pytest.param("~\n", "specs/x.yaml: file is empty", id="null-document"),
        pytest.param(LAUGHS, "the document expands to more than 10000 values", id="billion-laughs"),
        pytest.param(
            "a: &a [*a]\n", "specs/x.yaml:1:8: a[0]: recursive alias", id="recursive-alias"
        ),
        pytest.param(
            "a: &a {x: 1}\nb:\n  <<: *a\n",
            "specs/x.yaml:3:3: b: merge keys (<<) are not supported",
            id="merge-key",
        ),
        pytest.param("? [a, b]\n: 1\n", "a key must be a plain value", id="complex-key"),
        pytest.param(
            "n: !!int 2x\n", "specs/x.yaml:1:4: n: '2x' is not a valid int", id="bad-explicit-int"
        ),
        pytest.param(
            "a: \x07\n",
            "specs/x.yaml:1:4: control character U+0007 is not allowed",
            id="control-char",
        ),
        pytest.param(
            b"id: caf\xe9\n",
            "specs/x.yaml: not UTF-8: byte 0xe9 at byte offset 7 (line 1)",
            id="latin1",
        ),
        pytest.param(
            b"a: 1\nb: \xff\xfe\n", "byte 0xff at byte offset 8 (line 2)", id="non-utf8-line-2"
        ),
        pytest.param(
            bytes(range(256)) * 4,
            "binary data, not YAML text: NUL byte at byte offset 0",
            id="binary-garbage",
        ),
        pytest.param(
            b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR",
            "binary data, not YAML text: NUL byte at byte offset 8",
            id="png-header",
        ),
        pytest.param(
            b"\x89PNG\r\n\x1a\n", "not UTF-8: byte 0x89 at byte offset 0", id="png-magic-only"
        ),
    ],
)
def test_rejected(data, expected):
    raw = data.encode() if isinstance(data, str) else data
    found = problems_of(raw)
    assert any(expected in p for p in found), found


def test_every_problem_is_reported_sorted():
    found = problems_of("b: !!python/name:os.system x\na: 1\na: 2\n")
    assert [p.split(": ", 1)[0] for p in found] == ["specs/x.yaml:1:4", "specs/x.yaml:3:1"]


def test_billion_laughs_points_at_the_alias_and_stops_early():
    found = problems_of(LAUGHS)
    assert len(found) == 1
    assert found[0].startswith("specs/x.yaml:4:36: d[7]: ")  # the alias *c inside d


def test_empty_allowed_for_markers():
    assert parse_yaml(b"", "m.reset.yaml", allow_empty=True).data == {}
    assert parse_yaml(b"# defaults\n", "m.reset.yaml", allow_empty=True).data == {}


def test_oversized_bytes_rejected_before_parsing():
    found = problems_of(b"a: [" * (MAX_BYTES // 4 + 1))  # would also be malformed
    assert found == [
        f"specs/x.yaml: file is {(MAX_BYTES + 4) / (1 << 20):.1f} MiB; "
        "spec and marker files are limited to 1.0 MiB"
    ]


@pytest.mark.parametrize(
    ("size", "ok"),
    [
        pytest.param(MAX_BYTES, True, id="exactly-1MiB"),
        pytest.param(MAX_BYTES + 1, False, id="1MiB-plus-1"),
    ],
)
def test_read_limited(tmp_path, size, ok):
    path = tmp_path / "big.yaml"
    path.write_bytes(b"a: " + b"x" * (size - 4) + b"\n")
    if ok:
        assert parse_yaml(read_limited(path, "big.yaml"), "big.yaml").data["a"].startswith("xxx")
    else:
        with pytest.raises(SpecInvalid, match="limited to 1.0 MiB"):
            read_limited(path, "big.yaml")


def test_read_limited_missing_file(tmp_path):
    with pytest.raises(SpecInvalid, match="nope.yaml: cannot read: No such file"):
        read_limited(tmp_path / "nope.yaml", "nope.yaml")


@pytest.mark.parametrize(
    ("path", "text"),
    [
        pytest.param((), "", id="root"),
        pytest.param(("source", "topic"), "source.topic", id="nested"),
        pytest.param(
            ("dataSchema", "metrics", 1, "field"), "dataSchema.metrics[1].field", id="list-index"
        ),
        pytest.param(
            ("source", "consumerProperties", "sasl.password"),
            'source.consumerProperties["sasl.password"]',
            id="dotted-key",
        ),
        pytest.param(("resetTo", "offsets", "0"), 'resetTo.offsets["0"]', id="numeric-key"),
    ],
)
def test_format_field(path, text):
    assert format_field(path) == text


def test_positions_of_a_document_without_file():
    parsed = ParsedYaml(path="<cli>", data={"a": 1})
    assert parsed.value_position(("a",)) == (None, None)


# --- nesting, and libyaml against the pure-Python parser ------------------------------------

from reconciler.spec import yamlsafe  # noqa: E402
from reconciler.spec.yamlevents import HAVE_LIBYAML, MAX_DEPTH  # noqa: E402

DEEP = {
    "flow-list": "a: " + "[" * 5000 + "]" * 5000 + "\n",
    "flow-map": "a: " + "{a: " * 3000 + "}" * 3000 + "\n",
    "block-list": "a:\n  " + "- " * 5000 + "x\n",
    "complex-keys": "? " * 5000 + "x\n",
    "indented": "".join(" " * i + f"k{i}:\n" for i in range(200)) + " " * 200 + "v: 1\n",
}
PARSERS = [pytest.param(False, id="pure-python")] + (
    [pytest.param(True, id="libyaml")] if HAVE_LIBYAML else []
)


@pytest.fixture(params=PARSERS)
def parser(request, monkeypatch):
    monkeypatch.setattr(yamlsafe, "HAVE_LIBYAML", request.param)
    return request.param


@pytest.mark.parametrize("name", sorted(DEEP))
def test_deep_nesting_is_a_problem_not_a_crash(parser, name):
    [problem] = problems_of(DEEP[name])
    assert f"nested more than {MAX_DEPTH} levels deep here" in problem
    assert problem.startswith("specs/x.yaml:")


def test_nesting_up_to_the_limit_is_fine(parser):
    lists = MAX_DEPTH - 1  # inside the document's own mapping
    value = parse_yaml("a: " + "[" * lists + "]" * lists + "\n", "x.yaml").data["a"]
    for _ in range(lists - 1):
        value = value[0]
    assert value == []
    [problem] = problems_of("a: " + "[" * (lists + 1) + "]" * (lists + 1) + "\n")
    assert "nested more than" in problem


def test_aliases_cannot_nest_deeper_than_the_limit(parser):
    depth = MAX_DEPTH // 2 + 2
    text = "a: &a " + "[" * depth + "]" * depth + "\nb: &b " + "[" * depth + "*a" + "]" * depth + "\n"
    [problem] = problems_of(text)
    assert f"expands to more than {MAX_DEPTH} levels of nesting" in problem


def test_a_megabyte_of_nesting_is_refused_quickly(parser):
    import time

    text = "a: " + "[" * (MAX_BYTES // 2 - 10) + "]" * (MAX_BYTES // 2 - 10)
    started = time.monotonic()
    [problem] = problems_of(text.encode())
    assert "nested more than" in problem
    assert time.monotonic() - started < 5


@pytest.mark.skipif(not HAVE_LIBYAML, reason="PyYAML without libyaml")
@pytest.mark.parametrize(
    "text",
    [
        SPEC,
        LAUGHS,
        "a: &x 1\nb: *x\nc: !!str 2\nd: 2026-11-20\ne: [1, {f: g}]\n",
        "a: [1, 2\n",
        "a:\n\tb: 1\n",
        "a: b: c\n",
        "a: \x07\n",
        "---\na: 1\n---\nb: 2\n",
        "a: *undefined\n",
        "a: &x 1\nb: &x 2\n",
        "a: !!python/name:os.system x\n",
        "a: 1\na: 2\n",
        "- just\n- a list\n",
        "'unterminated\n",
    ],
)
def test_libyaml_and_pure_python_agree(monkeypatch, text):
    """Same data, positions and messages: on any libyaml error the pure-Python parser explains it."""

    def outcome(libyaml: bool):
        monkeypatch.setattr(yamlsafe, "HAVE_LIBYAML", libyaml)
        try:
            parsed = parse_yaml(text, "x.yaml")
        except SpecInvalid as exc:
            return [str(p) for p in exc.problems]
        return parsed.data, dict(parsed.values), dict(parsed.keys)

    assert outcome(True) == outcome(False)
