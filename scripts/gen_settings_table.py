#!/usr/bin/env python3
"""Write the settings table of docs/settings.md from ``reconciler/settings.py``, where each
setting is declared once (default, environment variable, config-file key, help text).

    .venv/bin/python scripts/gen_settings_table.py          # rewrite the table in docs/settings.md
    .venv/bin/python scripts/gen_settings_table.py --check  # exit 1 if docs/settings.md differs

The table sits between two HTML comments in docs/settings.md; everything else is left alone.
tests/test_docs.py runs ``--check``, so a setting added without this command fails the suite.
"""

from __future__ import annotations

import re
import sys
from dataclasses import MISSING, fields
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from reconciler.settings import MULTIPLE, Settings  # noqa: E402  (the checkout's, not an installed one)

PAGE = ROOT / "docs" / "settings.md"
BEGIN = "<!-- settings table: generated from reconciler/settings.py by scripts/gen_settings_table.py; do not edit -->"
END = "<!-- end of the generated settings table -->"
COMMAND = ".venv/bin/python scripts/gen_settings_table.py"


def _default(f) -> str:
    if "shown" in f.metadata:
        return f.metadata["shown"]
    value = f.default if f.default is not MISSING else f.default_factory()  # type: ignore[misc]
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, float):
        return f"`{value:g}`"
    if value in ("", None, {}, []):
        return "none"
    return f"`{value}`"


def _meaning(f) -> str:
    # the default has its own column
    return re.sub(r"\s*\(default: [^()]*\)$", "", f.metadata["help"]).replace("|", "\\|")


def _option(f) -> str:
    flag = "--" + f.name.replace("_", "-")
    if f.name in MULTIPLE:
        return f"`{flag} {f.metadata.get('metavar', 'VALUE')}` (repeatable)"
    return f"`{flag}`"


def table() -> str:
    rows = ["| config key | option | environment | default | meaning |", "| --- | --- | --- | --- | --- |"]
    for f in fields(Settings):
        rows.append(f"| `{f.metadata['key']}` | {_option(f)} | `{f.metadata['env']}` | {_default(f)} | {_meaning(f)} |")
    return "\n".join(rows)


def render(page: str) -> str:
    """The page with its table replaced by the one settings.py gives."""
    if page.count(BEGIN) != 1 or page.count(END) != 1:
        raise SystemExit(f"docs/{PAGE.name}: expected one {BEGIN!r} and one {END!r} around the settings table")
    head, rest = page.split(BEGIN)
    _, tail = rest.split(END)
    return f"{head}{BEGIN}\n{table()}\n{END}{tail}"


def main(argv: list[str]) -> int:
    current = PAGE.read_text(encoding="utf-8")
    wanted = render(current)
    if argv == ["--check"]:
        if current != wanted:
            print(f"docs/settings.md's table differs from reconciler/settings.py: run `{COMMAND}` "
                  "and commit docs/settings.md", file=sys.stderr)
            return 1
        return 0
    if argv:
        print(__doc__, file=sys.stderr)
        return 2
    if current != wanted:
        PAGE.write_text(wanted, encoding="utf-8")
        print("docs/settings.md: settings table written")
    else:
        print("docs/settings.md: settings table up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
