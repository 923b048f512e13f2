"""The import layers of ``pyproject.toml`` ([tool.importlinter]) hold: no arrow runs back up,
and ``plan`` imports nothing that does I/O. Runs the virtualenv's ``lint-imports``."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_import_layers_hold():
    exe = Path(sys.executable).with_name("lint-imports")
    command = str(exe) if exe.exists() else shutil.which("lint-imports")
    assert command, "lint-imports is missing: install the test extra (pip install -e '.[test]')"
    done = subprocess.run(
        [command, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, f"import contracts broken:\n{done.stdout}\n{done.stderr}"


PACKAGE = ROOT / "reconciler"
MAX_ROOT_MODULES = 8  # the ground: model, errors, settings, logs, faults (and __init__)
MAX_LINES = 500


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if "migrations" in path.parts:  # alembic's scripts: loaded by alembic, one revision each
            continue
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def test_the_root_holds_only_the_ground():
    loose = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(loose) <= MAX_ROOT_MODULES, f"{len(loose)} modules at the package root: {loose}"


def test_no_module_over_500_lines():
    long = {str(p.relative_to(ROOT)): n for p in _modules().values()
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, f"split these by concern: {long}"


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules ``name`` imports, anywhere in it (a function's late import too:
    it is an arrow all the same), except under ``if TYPE_CHECKING:``."""
    import ast

    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip |= {id(n) for n in ast.walk(node)}
    is_pkg = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".") if is_pkg else name.split(".")[:-1]
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        else:
            continue
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name:
                out.add(t)
    return out


def test_no_import_circle_between_modules():
    """A package's ``__init__`` that only re-exports is left out: importing a sibling through
    it is not a circle of concerns."""
    mods = _modules()
    known = set(mods)
    graph = {n: {t for t in _imports(n, p, known) if mods[t].name != "__init__.py"}
             for n, p in mods.items() if p.name != "__init__.py"}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    circles: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert not circles, f"modules importing each other: {circles}"


def test_no_service_launchers_in_the_package():
    """Starting brokers, clusters and databases is the tests' and scripts' business."""
    launchers = [str(p.relative_to(ROOT)) for p in _modules().values()
                 if any(word in p.read_text(encoding="utf-8")
                        for word in ("rabbitmq-server", "initdb", "pg_ctl", "tansu", "start-master.sh"))]
    assert not launchers, launchers
