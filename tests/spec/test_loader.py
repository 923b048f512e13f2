"""The spec directory: classification, spec and marker files, and the whole directory state."""

from __future__ import annotations

import dataclasses
import hashlib
import os
from datetime import UTC, datetime

import pytest

from reconciler.errors import SpecInvalid
from reconciler.model import KafkaSource, Position, RabbitSource, file_stem
from reconciler.spec.loader import (
    DirectoryState,
    classify,
    load_directory,
    load_marker_file,
    load_spec_file,
    marker_supervisor_id,
    spec_warnings,
)
from reconciler.spec.yamlsafe import MAX_BYTES

NOW = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)


def spec_text(sid: str = "clicks", topic: str = "clicks") -> str:
    return f"""\
id: {sid}
source:
  type: kafka
  bootstrapServers: 127.0.0.1:9092
  topic: {topic}
  consumerProperties:
    sasl.password: ${{env:KAFKA_PASSWORD}}
dataSchema:
  datasource: {sid.replace("-", "_")}
  timestamp: {{column: ts}}
"""


RABBIT = """\
id: orders
source:
  type: rabbitmq
  uri: rabbitmq-stream://guest:${env:RMQ_PASSWORD}@127.0.0.1:5552/%2f
  streams: [orders-0, orders-1]
dataSchema:
  datasource: orders
  timestamp: {column: ts}
"""

LAUGHS = "".join(
    [f"l0: &l0 [{', '.join(['lol'] * 10)}]\n"]
    + [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]\n" for i in range(1, 9)]
)


@pytest.fixture
def specs(tmp_path, monkeypatch):
    """An empty ``specs/`` directory, addressed relatively as an operator would."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "specs").mkdir()
    return tmp_path / "specs"


# --- classify -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        pytest.param("clicks.yaml", "spec", id="yaml"),
        pytest.param("clicks.yml", "spec", id="yml"),
        pytest.param("Clicks.YAML", "spec", id="upper-case-extension"),
        pytest.param("specs/clicks.yaml", "spec", id="with-directory"),
        pytest.param("clicks.reset.yaml", "marker", id="marker"),
        pytest.param("clicks.reset.yml", "marker", id="marker-yml"),
        pytest.param("clicks.reset.yaml.applied", "ignored", id="applied"),
        pytest.param("clicks.reset.yaml.rejected", "ignored", id="rejected"),
        pytest.param(".clicks.yaml.swp", "ignored", id="vim-swap"),
        pytest.param(".clicks.yaml", "ignored", id="dotfile"),
        pytest.param(".#clicks.yaml", "ignored", id="emacs-lock"),
        pytest.param("#clicks.yaml#", "ignored", id="emacs-autosave"),
        pytest.param("clicks.yaml~", "ignored", id="backup-tilde"),
        pytest.param("clicks.yaml.bak", "ignored", id="backup-bak"),
        pytest.param("clicks.yaml.orig", "ignored", id="merge-orig"),
        pytest.param("4913", "ignored", id="vim-probe"),
        pytest.param(".git", "ignored", id="git-dir"),
        pytest.param("README.md", "ignored", id="readme"),
        pytest.param("clicks.json", "ignored", id="json"),
        pytest.param(".reset.yaml", "ignored", id="marker-without-id"),
        pytest.param("", "ignored", id="empty-name"),
    ],
)
def test_classify(name, kind):
    assert classify(name) == kind


def test_marker_supervisor_id():
    assert marker_supervisor_id("specs/clicks-rollup.reset.yaml") == "clicks-rollup"
    with pytest.raises(ValueError, match="expected <id>.reset.yaml"):
        marker_supervisor_id("clicks.yaml")


@pytest.mark.parametrize(
    ("path", "stem"),
    [
        ("specs/clicks.reset.yaml", "clicks"),
        ("clicks.reset.yml", "clicks"),
        ("specs/Clicks.RESET.YAML", "Clicks"),  # classify calls it a marker: so does the id
        ("specs/clicks.YML", "clicks"),
        ("clicks.yaml", "clicks"),
        ("specs\\clicks.Reset.Yaml", "clicks"),
        ("notes.txt", "notes.txt"),
    ],
)
def test_file_stem_is_case_insensitive_like_classify(path, stem):
    """One suffix rule for the loader, its id recovery and the plan's rejected markers (issue 16)."""
    assert file_stem(path) == stem
    if classify(path) == "marker":
        assert marker_supervisor_id(path.replace("\\", "/")) == stem


# --- load_spec_file -------------------------------------------------------------------


def test_load_valid_kafka_spec_keeps_references_verbatim(specs):
    (specs / "clicks.yaml").write_text(spec_text())
    spec = load_spec_file("specs/clicks.yaml")
    assert spec.id == "clicks"
    assert spec.source == KafkaSource(
        "127.0.0.1:9092", "clicks", {"sasl.password": "${env:KAFKA_PASSWORD}"}
    )
    assert spec.document["source"]["consumerProperties"]["sasl.password"] == "${env:KAFKA_PASSWORD}"
    assert spec.data_schema.datasource == "clicks"
    assert spec.start_from == Position("earliest")


def test_load_valid_rabbitmq_spec(specs):
    (specs / "orders.yml").write_text(RABBIT)
    spec = load_spec_file(specs / "orders.yml")
    assert spec.source == RabbitSource(
        "rabbitmq-stream://guest:${env:RMQ_PASSWORD}@127.0.0.1:5552/%2f", ("orders-0", "orders-1")
    )


def test_misspelled_key_names_file_line_column_and_suggestion(specs):
    text = spec_text().replace("dataSchema:", "startFrom: latest\ndataSchema:")
    text = text.replace("  topic: clicks\n", "").replace(
        "  bootstrapServers: 127.0.0.1:9092\n",
        "  bootstrapServers: 127.0.0.1:9092\n  # topic below\n  topc: clicks\n",
    )
    (specs / "clicks.yaml").write_text("# clicks from the web frontend\n" + text)
    with pytest.raises(SpecInvalid) as info:
        load_spec_file("specs/clicks.yaml")
    assert (
        str(info.value) == "specs/clicks.yaml:7:3: source.topc: unknown key (did you mean 'topic'?)"
    )
    problem = info.value.first
    assert (problem.path, problem.line, problem.column, problem.field) == (
        "specs/clicks.yaml",
        7,
        3,
        "source.topc",
    )


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        pytest.param(
            spec_text().replace("id: clicks", "id: Clicks"),
            "specs/bad.yaml:1:5: id: 'Clicks' is not a valid id",
            id="uppercase-id",
        ),
        pytest.param(
            spec_text().replace("id: clicks", "id: ../x"),
            "specs/bad.yaml:1:5: id: '../x' is not a valid id",
            id="traversal-id",
        ),
        pytest.param(
            spec_text() + "taskCount: 2x\n",
            "specs/bad.yaml:11:12: taskCount: expected integer, got string '2x'",
            id="wrong-type",
        ),
        pytest.param(
            spec_text().replace("  topic: clicks\n", ""),
            "specs/bad.yaml:2:1: source: missing required key 'topic'",
            id="missing-required",
        ),
        pytest.param(
            spec_text() + "  metrics: [{name: b, type: longSum}]\n",
            "specs/bad.yaml:11:13: dataSchema.metrics[0]: missing required key 'field'",
            id="metric-without-field",
        ),
        pytest.param(
            RABBIT.replace("  streams:", "  stream:"),
            "specs/bad.yaml:5:3: source.stream: unknown key (did you mean 'streams'?)",
            id="rabbitmq-misspelled-key",
        ),
        pytest.param(
            spec_text() + "startFrom: {timestamp: '2999-01-01T00:00:00Z'}\n",
            "specs/bad.yaml:11:24: startFrom.timestamp: timestamp 2999-01-01T00:00:00Z is in the future",
            id="start-from-future",
        ),
        pytest.param("", "specs/bad.yaml: file is empty", id="empty-spec"),
        pytest.param(
            "a: 1\n---\nb: 2\n",
            "specs/bad.yaml:2:1: a second YAML document starts here",
            id="multiple-documents",
        ),
        pytest.param(
            "id: clicks\nsource:\n\ttype: kafka\n", "specs/bad.yaml:3:1: tab character", id="tabs"
        ),
        pytest.param(
            "id: !!python/object/apply:os.system ['touch pwned']\n",
            "specs/bad.yaml:1:5: id: YAML tag !!python/object/apply:os.system is not allowed (safe YAML only)",
            id="python-object-apply",
        ),
        pytest.param(LAUGHS, "the document expands to more than 10000 values", id="billion-laughs"),
        pytest.param(
            b"id: caf\xe9\n",
            "specs/bad.yaml: not UTF-8: byte 0xe9 at byte offset 7 (line 1)",
            id="non-utf8",
        ),
        pytest.param(
            bytes(range(255, -1, -1)),
            "specs/bad.yaml: binary data, not YAML text: NUL byte",
            id="binary-garbage",
        ),
        pytest.param(
            b"id: x\n" + b"#" * MAX_BYTES,
            "specs/bad.yaml: file is 1.0 MiB; spec and marker files are limited to 1.0 MiB",
            id="over-1MiB",
        ),
    ],
)
def test_invalid_spec_files(specs, content, expected):
    path = specs / "bad.yaml"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    with pytest.raises(SpecInvalid) as info:
        load_spec_file("specs/bad.yaml", now=NOW)
    assert any(expected in str(p) for p in info.value.problems), str(info.value)


def test_python_tag_is_never_executed(specs):
    (specs / "bad.yaml").write_text(
        f"id: !!python/object/apply:os.system ['touch {specs}/pwned']\n"
    )
    with pytest.raises(SpecInvalid):
        load_spec_file("specs/bad.yaml")
    assert not (specs / "pwned").exists()


def test_symlink_leaving_the_directory_is_an_error(specs, tmp_path):
    outside = tmp_path / "elsewhere.yaml"
    outside.write_text(spec_text())
    (specs / "clicks.yaml").symlink_to(outside)
    with pytest.raises(
        SpecInvalid, match=r"specs/clicks.yaml: symlink leaves the spec directory \(points to "
    ):
        load_spec_file("specs/clicks.yaml")


def test_symlink_inside_the_directory_is_fine(specs):
    (specs / "real").mkdir()
    (specs / "real" / "clicks.yaml").write_text(spec_text())
    (specs / "clicks.yaml").symlink_to("real/clicks.yaml")
    assert load_spec_file("specs/clicks.yaml").id == "clicks"


def test_dangling_symlink_is_an_error(specs):
    (specs / "clicks.yaml").symlink_to("gone.yaml")
    with pytest.raises(SpecInvalid, match="symlink points to a missing file"):
        load_spec_file("specs/clicks.yaml")


def test_file_name_differing_from_id_is_only_a_warning(specs):
    (specs / "web.yaml").write_text(spec_text())
    spec = load_spec_file("specs/web.yaml")
    assert [str(w) for w in spec_warnings("specs/web.yaml", spec)] == [
        "specs/web.yaml: id: id 'clicks' differs from the file name; by convention the file is clicks.yaml"
    ]
    assert spec_warnings("specs/clicks.yaml", spec) == []


# --- load_marker_file -----------------------------------------------------------------


def test_empty_marker_means_defaults(specs):
    (specs / "clicks.reset.yaml").write_bytes(b"")
    marker = load_marker_file("specs/clicks.reset.yaml", ["clicks"])
    assert marker.supervisor_id == "clicks"
    assert marker.path == "specs/clicks.reset.yaml"
    assert marker.reset_to == Position("latest")
    assert marker.backfill is True
    assert marker.token == hashlib.sha256(b"clicks.reset.yaml\0").hexdigest()


def test_marker_with_every_field(specs):
    body = (
        b"resetTo: {offsets: {0: 1200, '1': 900}}\nbackfill: false\nbackfillTaskCount: 4\n"
        b"allowRewind: true\nreason: lag alarm INC-42\n"
    )
    (specs / "clicks.reset.yml").write_bytes(body)
    marker = load_marker_file("specs/clicks.reset.yml")
    assert marker.reset_to == Position("offsets", offsets={"0": 1200, "1": 900})
    assert (marker.backfill, marker.backfill_task_count, marker.allow_rewind) == (False, 4, True)
    assert marker.reason == "lag alarm INC-42"
    assert marker.token == hashlib.sha256(b"clicks.reset.yml\0" + body).hexdigest()


def test_marker_token_depends_on_name_and_content_not_directory_spelling(specs):
    (specs / "a.reset.yaml").write_text("resetTo: latest\n")
    (specs / "b.reset.yaml").write_text("resetTo: latest\n")
    token_a = load_marker_file("specs/a.reset.yaml").token
    assert load_marker_file(os.path.abspath("specs/a.reset.yaml")).token == token_a
    assert load_marker_file("specs/b.reset.yaml").token != token_a
    (specs / "a.reset.yaml").write_text("resetTo: earliest\n")
    assert load_marker_file("specs/a.reset.yaml").token != token_a


@pytest.mark.parametrize(
    ("name", "content", "known", "expected"),
    [
        pytest.param(
            "nobody.reset.yaml",
            "",
            ["clicks", "orders"],
            "specs/nobody.reset.yaml: unknown supervisor 'nobody' (known: clicks, orders)",
            id="unknown-supervisor",
        ),
        pytest.param(
            "nobody.reset.yaml",
            "",
            [],
            "unknown supervisor 'nobody' (known: none)",
            id="no-supervisors",
        ),
        pytest.param(
            "clicks.reset.yaml",
            "resetTo: {timestamp: '2999-01-01T00:00:00Z'}\n",
            None,
            "specs/clicks.reset.yaml:1:22: resetTo.timestamp: timestamp 2999-01-01T00:00:00Z is in the future",
            id="timestamp-in-future",
        ),
        pytest.param(
            "clicks.reset.yaml",
            "resetTo: {timestamp: last tuesday}\n",
            None,
            "specs/clicks.reset.yaml:1:22: resetTo.timestamp: not a timestamp",
            id="timestamp-unparseable",
        ),
        pytest.param(
            "clicks.reset.yaml",
            "resetTo: lastest\n",
            None,
            "specs/clicks.reset.yaml:1:10: resetTo: must be one of: earliest, latest, {timestamp: ...}, "
            "{offsets: {...}}, {shiftBy: N}; got string 'lastest' (did you mean 'latest'?)",
            id="reset-to-typo",
        ),
        pytest.param(
            "Clicks.reset.yaml", "", None, "'Clicks' is not a supervisor id", id="bad-id-in-name"
        ),
        pytest.param(
            "clicks.reset.yaml",
            "- latest\n",
            None,
            "the document must be a mapping",
            id="list-marker",
        ),
        pytest.param(
            "x.reset.yaml",
            "resetTo: [\n",
            ["clicks"],
            "unknown supervisor 'x'",
            id="unknown-and-broken",
        ),
    ],
)
def test_rejected_markers(specs, name, content, known, expected):
    (specs / name).write_text(content)
    with pytest.raises(SpecInvalid) as info:
        load_marker_file(f"specs/{name}", known, now=NOW)
    assert any(expected in str(p) for p in info.value.problems), str(info.value)


# --- load_directory -------------------------------------------------------------------


def test_directory_state(specs):
    (specs / "clicks.yaml").write_text(spec_text())
    (specs / "orders.yaml").write_text(RABBIT)
    (specs / "broken.yaml").write_text(spec_text("broken") + "taskCount: many\n")
    (specs / "clicks.reset.yaml").write_text("reason: lag\n")
    (specs / "broken.reset.yaml").write_text("")
    (specs / "ghost.reset.yaml").write_text("")
    for ignored in (
        ".clicks.yaml.swp",
        "clicks.yaml~",
        "#clicks.yaml#",
        "x.reset.yaml.applied",
        "y.reset.yaml.rejected",
        "README.md",
        ".hidden.yaml",
    ):
        (specs / ignored).write_bytes(b"\0\xff garbage")
    (specs / ".git").mkdir()
    (specs / ".git" / "config.yaml").write_text("core: {}\n")
    (specs / "sub").mkdir()
    (specs / "sub" / "deep.yaml").write_text(spec_text("deep"))
    (specs / "dir.yaml").mkdir()

    state = load_directory("specs/", now=NOW)

    assert state.ok and state.error is None and state.path == "specs/"
    assert sorted(state.specs) == ["specs/clicks.yaml", "specs/orders.yaml"]
    assert sorted(state.by_id()) == ["clicks", "orders"]
    assert list(state.invalid) == ["specs/broken.yaml"]
    assert (
        str(state.invalid["specs/broken.yaml"])
        == "specs/broken.yaml:11:12: taskCount: expected integer, got string 'many'"
    )
    assert dict(state.invalid_ids) == {"broken": "specs/broken.yaml"}
    assert sorted(m.supervisor_id for m in state.markers) == [
        "broken",
        "clicks",
    ]  # broken file: still known
    assert list(state.rejected_markers) == ["specs/ghost.reset.yaml"]
    assert "unknown supervisor 'ghost' (known: broken, clicks, orders)" in str(
        state.rejected_markers["specs/ghost.reset.yaml"]
    )
    assert [str(p) for p in state.problems][0].startswith("specs/broken.yaml:11:12:")
    assert state.warnings == ()


def test_directory_state_is_frozen(specs):
    state = load_directory("specs")
    assert state == DirectoryState(path="specs", ok=True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        state.ok = False  # type: ignore[misc]
    with pytest.raises(TypeError):
        state.specs["x"] = None  # type: ignore[index]


@pytest.mark.parametrize(
    ("spelling", "shown"),
    [
        pytest.param("specs/", "specs/clicks.yaml", id="trailing-slash"),
        pytest.param("specs", "specs/clicks.yaml", id="no-slash"),
        pytest.param("./specs", "./specs/clicks.yaml", id="dot-slash"),
    ],
)
def test_paths_are_shown_as_the_caller_spelled_them(specs, spelling, shown):
    (specs / "clicks.yaml").write_text(spec_text() + "taskCount: 0\n")
    state = load_directory(spelling)
    assert list(state.invalid) == [shown]
    assert state.invalid[shown].first.path == shown


def test_absolute_directory(specs):
    (specs / "clicks.yaml").write_text(spec_text())
    state = load_directory(specs)
    assert list(state.specs) == [str(specs / "clicks.yaml")]


@pytest.mark.parametrize(
    ("make", "message"),
    [
        pytest.param(lambda p: None, "spec directory {p} does not exist", id="missing"),
        pytest.param(
            lambda p: p.write_text("x"), "spec directory {p} is not a directory", id="a-file"
        ),
    ],
)
def test_unreadable_directory_is_not_empty(tmp_path, make, message):
    target = tmp_path / "specs"
    make(target)
    state = load_directory(target)
    assert not state.ok
    assert state.error == message.format(p=target)
    assert state.specs == {} and state.invalid == {}


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any directory")
def test_directory_without_permission(tmp_path):
    target = tmp_path / "specs"
    target.mkdir(mode=0)
    try:
        state = load_directory(target)
    finally:
        target.chmod(0o755)
    assert not state.ok and "cannot be read" in (state.error or "")


def test_duplicate_ids_make_every_file_invalid(specs):
    (specs / "a.yaml").write_text(spec_text())
    (specs / "b.yaml").write_text("# copy of a\n" + spec_text(topic="clicks2"))
    (specs / "c.yaml").write_text(spec_text("other"))
    state = load_directory("specs", now=NOW)
    assert list(state.specs) == ["specs/c.yaml"]
    assert [str(e) for e in state.invalid.values()] == [
        "specs/a.yaml:1:1: id: id 'clicks' is also declared in specs/b.yaml",
        "specs/b.yaml:2:1: id: id 'clicks' is also declared in specs/a.yaml",
    ]
    assert dict(state.invalid_ids) == {"clicks": "specs/a.yaml"}
    assert state.warnings[0].message.startswith("id 'other' differs from the file name")


def test_duplicate_id_with_an_otherwise_broken_file(specs):
    (specs / "a.yaml").write_text(spec_text())
    (specs / "b.yaml").write_text(spec_text() + "taskCount: -1\n")
    state = load_directory("specs")
    assert state.specs == {}
    assert "also declared in specs/b.yaml" in str(state.invalid["specs/a.yaml"])
    assert [p.field for p in state.invalid["specs/b.yaml"].problems] == ["id", "taskCount"]


@pytest.mark.parametrize(
    ("name", "content", "recovered"),
    [
        pytest.param(
            "a.yaml", spec_text("clicks") + "taskCount: x\n", "clicks", id="from-parsed-mapping"
        ),
        pytest.param(
            "b.yaml", "id: clicks\nsource:\n\ttype: kafka\n", "clicks", id="from-text-tabs"
        ),
        pytest.param(
            "c.yaml",
            "# the clicks job\nid: 'clicks'  # main\nsource: [\n",
            "clicks",
            id="from-text-quoted",
        ),
        pytest.param("d.yaml", "id: clicks\nid: clicks2\n", "clicks", id="from-text-duplicate-key"),
        pytest.param("clicks.yaml", b"\x00\x01binary", "clicks", id="from-file-stem"),
        pytest.param("clicks.yml", "source: {}\n", "clicks", id="stem-when-id-missing"),
        pytest.param("e.yaml", "id: 7\n", "e", id="stem-when-id-not-a-string"),
    ],
)
def test_invalid_ids_are_recovered(specs, name, content, recovered):
    path = specs / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    state = load_directory("specs")
    assert dict(state.invalid_ids) == {recovered: f"specs/{name}"}


def test_symlink_leaving_the_directory_is_invalid_not_absent(specs, tmp_path):
    (tmp_path / "outside.yaml").write_text(spec_text())
    (specs / "clicks.yaml").symlink_to(tmp_path / "outside.yaml")
    state = load_directory("specs")
    assert state.specs == {}
    assert "symlink leaves the spec directory" in str(state.invalid["specs/clicks.yaml"])
    assert dict(state.invalid_ids) == {"clicks": "specs/clicks.yaml"}


def test_symlinked_subdirectory_is_ignored(specs, tmp_path):
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "x.yaml").write_text(spec_text("x"))
    (specs / "linked.yaml").symlink_to(tmp_path / "other")
    state = load_directory("specs")
    assert state.specs == {} and state.invalid == {}


# --- markers that cannot be applied as they are ----------------------------------------


def test_a_directory_named_like_a_marker_is_rejected(specs):
    (specs / "clicks.yaml").write_text(spec_text())
    (specs / "clicks.reset.yaml").mkdir()
    state = load_directory("specs")
    assert state.markers == ()
    [problem] = state.rejected_markers["specs/clicks.reset.yaml"].problems
    assert problem.path == "specs/clicks.reset.yaml"
    assert "is a directory: a marker must be a regular file" in str(problem)


def test_two_markers_for_one_supervisor_are_both_rejected(specs):
    (specs / "clicks.yaml").write_text(spec_text())
    (specs / "orders.yaml").write_text(RABBIT)
    (specs / "clicks.reset.yaml").write_text("resetTo: latest\n")
    (specs / "clicks.reset.yml").write_text("resetTo: earliest\nallowRewind: true\n")
    (specs / "orders.reset.yaml").write_text("")
    state = load_directory("specs", now=NOW)
    assert [m.path for m in state.markers] == ["specs/orders.reset.yaml"], "the unambiguous one is kept"
    for name, other in (("clicks.reset.yaml", "clicks.reset.yml"), ("clicks.reset.yml", "clicks.reset.yaml")):
        [problem] = state.rejected_markers[f"specs/{name}"].problems
        assert "ambiguous: 2 markers for supervisor 'clicks' in one pass" in problem.message
        assert f"also {other}" in problem.message and "none is applied" in problem.message


def test_an_invalid_second_marker_leaves_the_valid_one_unambiguous(specs):
    (specs / "clicks.yaml").write_text(spec_text())
    (specs / "clicks.reset.yaml").write_text("resetTo: latest\n")
    (specs / "clicks.RESET.yml").write_text("resetTo: sideways\n")
    state = load_directory("specs", now=NOW)
    assert [m.path for m in state.markers] == ["specs/clicks.reset.yaml"]
    assert "ambiguous" not in str(state.rejected_markers["specs/clicks.RESET.yml"])


def test_ambiguous_markers_are_planned_as_rejections(specs):
    from reconciler.control.actual import ActualState
    from reconciler.control.plan import ActionKind, desired_from_directory, plan

    (specs / "clicks.yaml").write_text(spec_text())
    (specs / "clicks.reset.yaml").write_text("")
    (specs / "clicks.reset.yml").write_text("")
    p = plan(desired_from_directory(load_directory("specs", now=NOW)), ActualState())
    rejections = [a for a in p.actions if a.kind == ActionKind.REJECT_MARKER]
    assert sorted(a.path for a in rejections) == ["specs/clicks.reset.yaml", "specs/clicks.reset.yml"]
    assert all(a.supervisor_id == "clicks" and "ambiguous" in (a.error or "") for a in rejections)
    assert not [a for a in p.actions if a.kind in (ActionKind.RESET, ActionKind.RESET_AND_BACKFILL)]


def test_a_config_repo_cloned_whole_says_where_its_specs_are(tmp_path):
    """Issue 46: `git clone <config repo> <specs>` put the specs one level down, where the
    watcher never looks: zero supervisors, silently. The load says where they are."""
    from reconciler.control.plan import ActualState, desired_from_directory, plan
    from reconciler.spec.loader import load_directory

    repo = tmp_path / "repo"
    (repo / "specs").mkdir(parents=True)
    (repo / ".git").mkdir()
    (repo / ".git" / "config.yaml").write_text("x: 1\n")  # a dot-directory is never looked into
    (repo / "specs" / "clicks.yaml").write_text("id: clicks\n")
    (repo / "README.md").write_text("config\n")
    state = load_directory(repo, check_permissions=False)
    assert not state.specs and state.hint is not None
    assert f"{repo / 'specs'} (1 YAML file)" in state.hint and ".git" not in state.hint
    assert "--specs" in state.hint
    assert state.hint in plan(desired_from_directory(state), ActualState()).notes
    (repo / "top.yaml").write_text("id: top\n")  # a spec at the top level: the layout is the operator's choice
    assert load_directory(repo, check_permissions=False).hint is None


def test_no_hint_for_an_empty_directory_or_one_without_yaml_below(tmp_path):
    from reconciler.spec.loader import load_directory

    assert load_directory(tmp_path, check_permissions=False).hint is None
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "x.md").write_text("x")
    assert load_directory(tmp_path, check_permissions=False).hint is None
