"""The docs say what the code does, and cannot drift from it.

* The README is short (what it is, the quick start, a tour, links) and the reference is in
  ``docs/``, one page a topic, each linked from the README; every relative link of the
  README and of each page resolves, to the file and to the heading it names.
* The settings table of ``docs/settings.md`` is the one ``scripts/gen_settings_table.py``
  writes from ``reconciler/settings.py``.
* Every ``reconciler ...`` command the README, ``docs/``, ``specs/README.md``, ``examples/`` and the
  commands' own ``--help`` examples show parses: its subcommand and every option exist and
  take the values shown. Those that need no broker run, as a reader would run them from a
  checkout: ``validate``, ``plan``, ``--help``, ``--version`` and ``maintain --dry-run``.
* Every file of the repository the docs and examples name exists (and every test
  RELIABILITY.md names), and they name no document the repository does not ship.
* The CI examples: the job's annotation script turns ``validate -o json`` into annotations
  and fails on a bad spec; both examples pin the release the changelog is at.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
import yaml

from reconciler.cli import cli

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = Path(sys.executable).parent / "reconciler"

# --------------------------------------------------------------------------- README and pages


def _pages() -> list[Path]:
    """The reference: docs/*.md, one page a topic."""
    return sorted((ROOT / "docs").glob("*.md"))


PAGES = {"spec.md", "settings.md", "output.md", "operations.md", "exactly-once.md", "benchmarks.md",
         "development.md"}
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def test_the_reference_is_in_docs_and_the_readme_links_every_page():
    """Issue 46: a 1,000-line README nobody finished. Each page of docs/ is linked from it."""
    pages = {p.name for p in _pages()}
    assert PAGES <= pages, f"docs/ lacks {sorted(PAGES - pages)}"
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    linked = {target.split("#")[0] for target in _links(readme)}
    assert {f"docs/{p}" for p in pages} <= linked, f"README.md links no {sorted({f'docs/{p}' for p in pages} - linked)}"
    assert re.search(r"^## Quick start$", readme, re.M) and "docs/screenshots/" in readme


def test_the_readme_is_one_a_newcomer_can_finish():
    """What it is, the two commands, a tour, the links: the reference lives in docs/."""
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) < 250, f"README.md has {len(lines)} lines: move reference text to a page of docs/"


def _links(text: str) -> list[str]:
    """The targets of a Markdown text's links and images, outside code blocks and spans."""
    targets, inside = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            inside = not inside
            continue
        if not inside:
            targets += LINK.findall(re.sub(r"`[^`]*`", "", line))
    return targets


def _anchors(text: str) -> set[str]:
    """The ids GitHub gives a page's headings: lower case, punctuation dropped, spaces as
    hyphens, a repeated one numbered."""
    seen: dict[str, int] = {}
    inside = False
    for line in text.splitlines():
        if FENCE.match(line):
            inside = not inside
            continue
        m = None if inside else re.match(r"^#{1,6} (.*?)#*\s*$", line)
        if m:
            base = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            seen[base] = seen.get(base, -1) + 1
            seen[f"{base}-{seen[base]}" if seen[base] else base] = 0
    return set(seen)


def broken_links(doc: Path) -> list[str]:
    broken = []
    for target in _links(doc.read_text(encoding="utf-8")):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:: not ours to check
            continue
        path, _, anchor = target.partition("#")
        file = (doc.parent / path).resolve() if path else doc
        if not file.exists():
            broken.append(f"{doc.relative_to(ROOT)}: ({target}): no file {path}")
        elif anchor and file.suffix == ".md" and anchor not in _anchors(file.read_text(encoding="utf-8")):
            broken.append(f"{doc.relative_to(ROOT)}: ({target}): {file.name} has no heading #{anchor}")
    return broken


@pytest.mark.parametrize("doc", [ROOT / "README.md", *_pages()], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(doc):
    assert not (broken := broken_links(doc)), "\n".join(broken)


def test_the_link_check_finds_what_it_looks_for(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A page\n\n## Reading `status`\n\n```\n# not a heading\n```\n")
    (tmp_path / "README.md").write_text(
        "[ok](docs/a.md) [ok](docs/a.md#reading-status) [ok](#top) ![ok](https://example.com/x.png)\n"
        "[gone](docs/b.md) [no heading](docs/a.md#not-a-heading) `[code](docs/c.md)`\n\n# Top\n")
    assert broken_links(tmp_path / "README.md") == [
        "README.md: (docs/b.md): no file docs/b.md",
        "README.md: (docs/a.md#not-a-heading): a.md has no heading #not-a-heading"]


# --------------------------------------------------------------------------- settings


def test_the_settings_table_is_generated_from_settings_py():
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_settings_table.py"), "--check"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr  # says the one command that regenerates it


@pytest.mark.parametrize("doc", ["docs/operations.md", "examples/etc/config.yaml",
                                 "systemd/stream-reconciler.service"])
def test_the_docs_name_every_setting_a_reload_cannot_change(doc):
    """Where a doc says which settings need a restart, it names each one the daemon keeps."""
    from dataclasses import fields

    from reconciler.daemon import RESTART_FIELDS
    from reconciler.settings import Settings

    keys = {f.name: f.metadata["key"] for f in fields(Settings)}
    text = " ".join((ROOT / doc).read_text(encoding="utf-8").split())
    m = re.search(r"([^.;(]*)\bneed (?:a restart|`systemctl restart)", text)
    assert m, f"{doc} does not say which settings need a restart"
    named = set(re.findall(r"\w+", m.group(1)))
    assert {keys[f] for f in RESTART_FIELDS} <= named, m.group(0)


# --------------------------------------------------------------------------- commands

FENCE = re.compile(r"^\s*```")
BINARY = re.compile(r"(?:^|(?<=[\s(`]))((?:[\w.~/-]*/)?reconciler)(?= )")
CUT = {"|", "||", "&&", ";", ">", ">>", "&", "<"}


def _doc_files() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "specs" / "README.md", *_pages()]
    files += sorted(p for p in (ROOT / "examples").rglob("*") if p.is_file() and p.suffix in (".md", ".yaml", ".yml"))
    return files


def _markdown_lines(text: str) -> Iterator[tuple[int, str, bool]]:
    """(line number, text, inline): code block lines (a console's ``$ `` dropped, ``\\``
    continuations joined) and inline code spans of the prose."""
    inside, pending = False, None
    for n, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            inside = not inside
            continue
        if not inside:
            for m in re.finditer(r"`([^`]+)`", line):
                yield n, m.group(1), True
            continue
        line = re.sub(r"^\s*\$ ", "", line)
        if pending is not None:
            n, line = pending[0], pending[1] + " " + line.strip()
            pending = None
        if line.rstrip().endswith("\\"):
            pending = (n, line.rstrip()[:-1])
            continue
        yield n, line, False


def _yaml_lines(text: str) -> Iterator[tuple[int, str, bool]]:
    """Each line, or the code spans of a line that has some (a comment's `reconciler ...`)."""
    for n, line in enumerate(text.splitlines(), 1):
        spans = re.findall(r"`([^`]+)`", line)
        for span in spans:
            yield n, span, True
        if not spans:
            yield n, line, False


def _tokens(command: str) -> list[str]:
    """The words of a shown command up to a pipe, redirection or the next command; the
    README's synopsis brackets (``[-o json]``, ``[ID]``) unwrapped."""
    command = re.split(r"\s{2,}", command.strip())[0]  # "reconciler plan    what it does" in --help
    command = re.sub(r"\[(-[^\]]+|[A-Z]+)\]", r"\1", command)
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    words = []
    try:
        for word in lexer:
            if word in CUT:
                break
            words.append(word)
    except ValueError as exc:  # an unclosed quote: shown so, it would not run either
        return [*words, f"<unparseable: {exc}>"]
    return words


def shown_commands() -> list[tuple[str, list[str], bool]]:
    """(where, arguments after the binary, mention) of every ``reconciler`` command shown;
    a mention is an inline code span naming a command alone (``reconciler apply``)."""
    found = []
    for path in _doc_files():
        text = path.read_text(encoding="utf-8")
        lines = _markdown_lines(text) if path.suffix == ".md" else _yaml_lines(text)
        for n, line, inline in lines:
            for m in BINARY.finditer(line):
                words = _tokens(line[m.end(1):])
                is_command = words and (words[0] in cli.commands or words[0].startswith("-"))
                if path.suffix != ".md" and not is_command:
                    continue  # prose in a YAML comment ("the reconciler sets it")
                mention = inline and len(words) == 1 and not words[0].startswith("-")
                found.append((f"{path.relative_to(ROOT)}:{n}", words, mention))
    for name, cmd in _all_commands(cli):
        for line in (cmd.epilog or "").splitlines():
            for m in BINARY.finditer(line):
                found.append((f"reconciler {name} --help", _tokens(line[m.end(1):]), False))
    return found


def _all_commands(group: click.Group, prefix: str = "") -> Iterator[tuple[str, click.Command]]:
    for name, cmd in sorted(group.commands.items()):
        yield prefix + name, cmd
        if isinstance(cmd, click.Group):
            yield from _all_commands(cmd, prefix + name + " ")


def parse(words: list[str]) -> list[str]:
    """Parse a command line as click would, without running it; the command's path
    (["backfill", "list"]). Raises click's UsageError on an unknown command or option."""
    ctx = cli.make_context("reconciler", list(words))
    path: list[str] = []
    group: click.Command = cli
    while isinstance(group, click.Group):
        with warnings.catch_warnings():  # click 8.2+ folds protected_args into args
            warnings.simplefilter("ignore", DeprecationWarning)
            rest = [*getattr(ctx, "protected_args", []), *ctx.args]
        if not rest:
            return path
        name, cmd, args = group.resolve_command(ctx, rest)
        path.append(name)
        ctx = cmd.make_context(name, args, parent=ctx)
        group = cmd
    return path


COMMANDS = shown_commands()


def test_the_docs_show_every_kind_of_command():
    shown = {" ".join(parse(w)) for _, w, mention in COMMANDS if not mention and _parses(w)}
    assert {"validate", "plan", "apply", "run", "status", "reset", "history", "db upgrade"} <= shown
    assert len(COMMANDS) > 60  # the extraction found the README's list, the walkthrough and the --help examples


def _parses(words: list[str]) -> bool:
    try:
        parse(words)
        return True
    except (click.UsageError, click.exceptions.Exit):
        return False


@pytest.mark.parametrize(("where", "words", "mention"), COMMANDS, ids=[c[0] for c in COMMANDS])
def test_every_shown_command_and_option_exists(where, words, mention):
    if mention:  # `reconciler apply` in a sentence: the command exists
        assert words[0] in cli.commands, f"{where}: no command {words[0]!r}"
        return
    try:
        parse(words)
    except click.exceptions.Exit:  # --help, --version: printed and done
        pass
    except click.UsageError as exc:
        pytest.fail(f"{where}: `reconciler {shlex.join(words)}`: {exc.format_message()}")


def _runnable(words: list[str]) -> bool:
    """Needs no broker and no table: validate, plan, help, version, maintain's dry run."""
    path = parse_or_none(words)
    if path is None:
        return "--help" in words or "--version" in words
    return path[:1] in (["validate"], ["plan"]) or (path == ["maintain"] and "--dry-run" in words)


def parse_or_none(words: list[str]) -> list[str] | None:
    try:
        return parse(words)
    except (click.UsageError, click.exceptions.Exit):
        return None


RUNNABLE = [(where, words) for where, words, mention in COMMANDS if not mention and _runnable(words)]


@pytest.fixture
def reader_env(tmp_path) -> dict[str, str]:
    """A reader's shell in a checkout: no host config file, no RECONCILER_* variables, the
    state in a directory of its own."""
    config = tmp_path / "config.yaml"
    config.write_text("{}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECONCILER_") and k != "STATE_DIRECTORY"}
    return env | {"RECONCILER_CONFIG": str(config), "RECONCILER_STATE_DIR": str(tmp_path / "state")}


@pytest.mark.parametrize(("where", "words"), RUNNABLE, ids=[c[0] for c in RUNNABLE])
def test_every_shown_command_that_needs_no_broker_runs(where, words, reader_env, tmp_path):
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(SCRIPT), *args], cwd=ROOT, env=reader_env, capture_output=True, text=True,
                              timeout=120)

    path = parse_or_none(words) or []
    if path == ["maintain"]:  # on a database the reader made with apply
        assert run("apply").returncode == 0
    r = run(*words)
    expected = (0, 2) if path == ["plan"] else (0,)  # plan: 2 = changes to apply
    assert r.returncode in expected, f"{where}: `reconciler {shlex.join(words)}` exit {r.returncode}\n{r.stderr}"
    if path == ["plan"]:
        assert not (tmp_path / "state").exists(), "plan wrote something"


def test_run_help_shows_an_example_that_needs_no_rabbitmq():
    epilog = cli.commands["run"].epilog
    examples = [_tokens(line[m.end(1):]) for line in epilog.splitlines() for m in BINARY.finditer(line)]
    assert examples
    for words in examples:
        specs = words[words.index("--specs") + 1] if "--specs" in words else "specs"
        for spec in (ROOT / specs).glob("*.y*ml"):
            assert yaml.safe_load(spec.read_text())["source"]["type"] == "kafka", spec


# --------------------------------------------------------------------------- named files

# what a clone holds at its top: a name that starts with one of these is a repository path
TOP = {p.name for p in ROOT.iterdir() if not p.name.startswith(".") or p.name in (".ci", ".pre-commit-hooks.yaml")}
TOP -= {"state", "segments", "build", "dist", "spark-warehouse", "test-artifacts"}  # made by runs, ignored by git
_TOP_ALTERNATIVES = "|".join(re.escape(t) for t in sorted(TOP, key=len, reverse=True))
PATH = re.compile(rf"(?<![\w./$<-])((?:{_TOP_ALTERNATIVES})(?:/[\w.-]+)*/?)(::[\w\[\]-]+)?")
NOT_SHIPPED = re.compile(r"\b(DESIGN|STYLE)(\.md)?\b")  # the team's own documents, not in the repository


def _named_in(path: Path) -> Iterator[tuple[int, str, str | None]]:
    last_file = None
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        for m in re.finditer(r"(?<![\w:])(::test_\w+)|" + PATH.pattern, line):
            if m.group(1):  # "::test_x" after a "tests/....py::test_y": the same file
                if last_file:
                    yield n, last_file, m.group(1)
                continue
            name, test = m.group(2).rstrip("."), m.group(3)  # a sentence's full stop
            if name.endswith(".py"):
                last_file = name
            yield n, name, test


DOCS = [ROOT / "README.md", ROOT / "RELIABILITY.md", ROOT / "CHANGELOG.md", ROOT / "specs" / "README.md",
        ROOT / "systemd" / "stream-reconciler.service", ROOT / "scripts" / "install.sh", *_doc_files()[2:]]


@pytest.mark.parametrize("doc", sorted(set(DOCS)), ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_name_only_files_the_repository_has(doc):
    missing = []
    for n, name, test in _named_in(doc):
        target = ROOT / name.rstrip("/")
        if not target.exists():
            missing.append(f"{doc.relative_to(ROOT)}:{n}: {name} does not exist")
        elif test and not re.search(rf"^(async )?def {re.escape(test[2:].split('[')[0])}\(",
                                    target.read_text(), re.M):
            missing.append(f"{doc.relative_to(ROOT)}:{n}: {name}{test}: no such test")
    for n, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
        if NOT_SHIPPED.search(line):
            missing.append(f"{doc.relative_to(ROOT)}:{n}: names {NOT_SHIPPED.search(line).group(0)}, "
                           "which the repository does not ship")
    assert not missing, "\n".join(missing)


def test_the_file_check_finds_what_it_looks_for(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("see `examples/nope.yaml`, tests/test_docs.py::test_nope and ::test_the_file_check_finds_"
                   "what_it_looks_for, scripts/install.sh\n")
    names = list(_named_in(doc))
    assert [(name, test) for _, name, test in names] == [
        ("examples/nope.yaml", None), ("tests/test_docs.py", "::test_nope"),
        ("tests/test_docs.py", "::test_the_file_check_finds_what_it_looks_for"), ("scripts/install.sh", None)]


# --------------------------------------------------------------------------- CI examples


def _pinned_ref_exists(ref: str) -> bool:
    """A release tag this repository holds, or a commit of its history (a shallow clone
    cannot tell: there, the form of a commit id)."""
    git = lambda *a: subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True)  # noqa: E731
    if re.fullmatch(r"v\d+\.\d+\.\d+", ref):
        return bool(git("tag", "-l", ref).stdout.strip())
    if not re.fullmatch(r"[0-9a-f]{7,40}", ref):
        return False
    if git("rev-parse", "--is-shallow-repository").stdout.strip() == "true":
        return True
    return git("cat-file", "-e", f"{ref}^{{commit}}").returncode == 0


def test_the_ci_examples_pin_a_ref_that_exists():
    """Issue 46: they pinned v0.2.0, which no tag held. Both examples pin the same ref: a
    release tag that exists, or (before the first release) a commit of this repository."""
    pre_commit = yaml.safe_load((ROOT / "examples" / "ci" / "pre-commit-config.yaml").read_text())
    [repo] = pre_commit["repos"]
    ref = str(repo["rev"])
    assert _pinned_ref_exists(ref), f"pre-commit rev {ref} names no tag or commit of this repository"
    hook_ids = {h["id"] for h in yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())}
    assert {h["id"] for h in repo["hooks"]} <= hook_ids
    job = yaml.safe_load((ROOT / "examples" / "ci" / "validate-specs.yml").read_text())
    installs = [s["run"] for s in job["jobs"]["validate"]["steps"] if "pip install" in s.get("run", "")]
    assert installs and all(f"@{ref}\"" in run for run in installs), installs  # a git ref, not an index version
    assert not re.search(r"stream-reconciler==", "\n".join(installs))


def test_the_changelog_agrees_with_the_release_section_and_the_ci_pin():
    """Issue 46, a newcomer: CHANGELOG pointed to README "Releases" (moved to
    docs/operations.md) and had "Upgrading from 0.1.0" while saying nothing is tagged. Each
    section it names (FILE, "Heading") is a heading of that file; it upgrades only from a
    release it describes or the tags hold; before the first tag it says a commit is pinned,
    as the CI examples do."""
    text = (ROOT / "CHANGELOG.md").read_text()
    named = re.findall(r'(README|[\w./-]+\.md),? "([^"]+)"', text)
    assert named, "the changelog names no section: this check would check nothing"
    for doc, heading in named:
        path = ROOT / ("README.md" if doc == "README" else doc)
        headings = {h.strip() for h in re.findall(r"^#+ (.+)$", path.read_text(), re.M)}
        assert heading in headings, f'CHANGELOG.md names {doc} "{heading}", which is no heading of {path.name}'
    released = set(re.findall(r"^## (\d+\.\d+\.\d+)", text, re.M))
    tags = set(subprocess.run(["git", "tag", "-l", "v*"], cwd=ROOT, capture_output=True, text=True
                              ).stdout.replace("v", "").split())
    for version in re.findall(r"[Uu]pgrading from (?:v)?(\d+\.\d+\.\d+)", text):
        assert version in released | tags, f"CHANGELOG.md upgrades from {version}, which no release or tag is"
    pin = str(yaml.safe_load((ROOT / "examples" / "ci" / "pre-commit-config.yaml").read_text())["repos"][0]["rev"])
    if not released and not tags:  # before the first release: both say a commit is pinned
        assert re.fullmatch(r"[0-9a-f]{7,40}", pin), pin
        assert "None is tagged yet" in (ROOT / "docs" / "operations.md").read_text()
        assert "No release is tagged yet" in text and "pin a commit" in text


def test_the_ci_job_annotates_each_problem_and_fails_on_a_bad_spec(tmp_path, reader_env):
    job = yaml.safe_load((ROOT / "examples" / "ci" / "validate-specs.yml").read_text())
    [step] = [s for s in job["jobs"]["validate"]["steps"] if s.get("name") == "reconciler validate"]
    script = step["run"].replace("reconciler validate", f"{SCRIPT} validate")
    specs = tmp_path / "repo" / "specs"
    specs.mkdir(parents=True)
    (specs / "clicks.yaml").write_text((ROOT / "examples" / "clicks.yaml").read_text())

    def job_run() -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", "-e", "-c", script], cwd=specs.parent, env=reader_env, capture_output=True,
                              text=True, timeout=120)

    good = job_run()
    assert good.returncode == 0, good.stdout + good.stderr
    assert "1 spec(s), 0 marker(s), 0 problem(s)" in good.stdout
    (specs / "clicks.yaml").write_text((specs / "clicks.yaml").read_text().replace("topic:", "topc:"))
    bad = job_run()
    assert bad.returncode == 1
    [annotation] = [x for x in bad.stdout.splitlines() if x.startswith("::error ")]
    assert re.fullmatch(r"::error file=specs/clicks\.yaml,line=\d+,col=3::source\.topc: unknown key.*", annotation)
    assert json.loads((specs.parent / "result.json").read_text())["ok"] is False


@pytest.mark.parametrize("folder", ["examples", "examples/lag-policy"])
def test_the_examples_validate_without_a_warning(folder, reader_env):
    """Issue 46: `reconciler validate examples/` warned that each id differed from its file
    name, so the examples broke the convention the README asks spec authors to keep."""
    env = {k: v for k, v in reader_env.items() if k != "RECONCILER_CONFIG"}  # the newcomer's run: no config file
    r = subprocess.run([str(SCRIPT), "validate", folder], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"^ok: [1-9]\d* spec\(s\)", r.stdout, re.M), r.stdout
    assert "warning" not in (r.stdout + r.stderr).lower(), r.stdout + r.stderr


def test_the_class_archive_step_does_not_promise_a_quiet_machine():
    """Issue 46: setup said "about 30 s" for a step that took 92 s on a loaded machine."""
    for script in ("scripts/setup.sh", "scripts/install.sh"):
        lines = [x for x in (ROOT / script).read_text().splitlines() if "class archive" in x and "step " in x]
        assert lines and all("90 s or more on a busy one" in x and "about 30 s" not in x for x in lines), script
