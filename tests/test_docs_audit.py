"""Every audit action the product writes is explained in docs/operations.md's "Audit log"
table (issue 46, the newcomer's third look: ``history clicks`` showed ``source-identity`` and
``source-fingerprint``, and no page said what they were).

The actions are found in the code, not listed by hand: every call that writes an audit entry
(``_audit(c, id, ACTION, ...)``, ``.audit(id, ACTION, ...)``, ``AuditNote(id, ACTION, ...)``) is
read with ``ast``; a literal, a module constant or a local chosen among literals is resolved
there. An action computed otherwise must be listed in ``COMPUTED`` with where its values come
from, so a new one fails here until it is documented.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

from reconciler.control.actual import State
from reconciler.control.lagpolicy import BreachEvent

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "reconciler"
WRITERS = {"_audit": 2, "audit": 1, "AuditNote": 1}  # the call, and the position of its action


def _set_state_actions() -> set[str]:
    """``set_state(id, State.X, ..., actor=...)`` audits ``x``: the states set with an actor."""
    found = set()
    for call, _path in _calls("set_state"):
        if any(k.arg == "actor" for k in call.keywords) and len(call.args) > 1:
            arg = call.args[1]
            if isinstance(arg, ast.Attribute) and isinstance(arg.value, ast.Name) and arg.value.id == "State":
                found.add(State[arg.attr].value.lower())
    return found


def _breach_actions() -> set[str]:
    """``AuditNote(sid, e.action, ...)`` of the lag policy's events: ``BreachEvent("...", ...)``."""
    found = set()
    for call, _path in _calls(BreachEvent.__name__):
        if call.args and isinstance(call.args[0], ast.Constant):
            found.add(call.args[0].value)
    return found


def _backfill_verbs() -> set[str]:
    """``f"{verb}-backfill"``: the verbs of ``reconciler backfill``."""
    from reconciler.cli import cli

    return {f"{verb}-backfill" for verb in cli.commands["backfill"].commands if verb != "list"}


# action expressions that are not literals, where they are, and where their values come from
COMPUTED = {
    ("reconciler/store/supervisors.py", "f'{verb}-backfill'"): _backfill_verbs,
    ("reconciler/store/supervisors.py", "state.lower()"): _set_state_actions,
    ("reconciler/store/audit.py", "action"): set,  # Store.audit's parameter: its callers are scanned
    ("reconciler/store/freshness.py", "n.action"): set,  # AuditNote's: the AuditNote(...) calls are scanned
    ("reconciler/observe/lagwatch.py", "e.action"): _breach_actions,
}


def _calls(name: str) -> Iterator[tuple[ast.Call, Path]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                func = node.func
                called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
                if called == name:
                    yield node, path


def _literals(node: ast.AST) -> set[str] | None:
    """The strings an expression made only of literals can be (``"a" if x else "b"``)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.IfExp):
        body, orelse = _literals(node.body), _literals(node.orelse)
        return body | orelse if body is not None and orelse is not None else None
    return None


def _assigned(tree: ast.AST, name: str) -> set[str] | None:
    """What a module constant or a local made of literals holds."""
    values: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            found = _literals(node.value)
            if found is None:
                return None
            values |= found
    return values or None


def written_actions() -> tuple[set[str], list[str]]:
    """The actions the code writes, and the action expressions this test cannot resolve."""
    actions: set[str] = set()
    unknown: list[str] = []
    for name, position in WRITERS.items():
        for call, path in _calls(name):
            if len(call.args) <= position:
                continue
            expr = call.args[position]
            found = _literals(expr)
            if found is None and isinstance(expr, ast.Name):
                found = _assigned(ast.parse(path.read_text(encoding="utf-8")), expr.id)
            where = (str(path.relative_to(ROOT)), ast.unparse(expr))
            if found is None and where in COMPUTED:
                found = COMPUTED[where]()
            if found is None:
                unknown.append(f"{where[0]}:{call.lineno}: {where[1]}")
            else:
                actions |= found
    return actions, unknown


def documented_actions() -> set[str]:
    text = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    section = re.search(r"^## Audit log\n(.*?)(?=^## )", text, re.S | re.M)
    assert section, "docs/operations.md has no '## Audit log' section"
    return set(re.findall(r"^\| `([a-z-]+)` \|", section[1], re.M))


def test_every_audit_action_the_code_writes_is_in_the_audit_log_table():
    actions, unknown = written_actions()
    assert not unknown, f"audit actions this test cannot resolve (add them to COMPUTED): {unknown}"
    assert {"source-identity", "source-fingerprint", "reset", "create"} <= actions  # the scan finds them
    documented = documented_actions()
    assert actions - documented == set(), f"docs/operations.md's Audit log table lacks {sorted(actions - documented)}"
    assert documented - actions == set(), f"the Audit log table lists actions no code writes: {sorted(documented - actions)}"


def test_the_scan_finds_an_action_of_each_shape(tmp_path, monkeypatch):
    (tmp_path / "m.py").write_text(
        'X = "const-action"\n'
        'def f(self, c, b):\n'
        '    self._audit(c, "id", "literal-action", "actor", None, None, None, None)\n'
        '    self._audit(c, "id", X, "actor", None, None, None, None)\n'
        '    action = "one" if b else "two"\n'
        '    self.audit("id", action, "actor")\n'
        '    self._audit(c, "id", compute(), "actor", None, None, None, None)\n')
    monkeypatch.setitem(globals(), "PACKAGE", tmp_path)
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    actions, unknown = written_actions()
    assert actions == {"literal-action", "const-action", "one", "two"}
    assert unknown == ["m.py:7: compute()"]
