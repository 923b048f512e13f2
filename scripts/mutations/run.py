"""Mutation audit of the schedule explorer (issue 41.14): each ``*.patch`` here removes one
real safety mechanism of the product. Each is applied to a temporary copy of the tree at
HEAD, or ``--rev`` (``git archive``; never the working tree), then the explorer runs on that copy:

    .venv/bin/python -m tests.explorer --db sqlite --seeds 0:<N> --named all --workers 2

which must fail (a schedule finds the defect). Prints one table row per mutation (how many
random seeds and named schedules failed) and exits 1 when a mutation was not caught.
Run it whenever these mechanisms change:

    .venv/bin/python scripts/mutations/run.py                 # every mutation, 300 seeds each
    .venv/bin/python scripts/mutations/run.py --seeds 1000 07-backfill-starts-at-checkpoint-plus-one

The unmutated copy runs first (``baseline``): it must pass, or the table means nothing.
A patch that no longer applies (the code moved) is reported as such: regenerate the
patches with ``scripts/mutations/make_patches.py`` after updating its replacements.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent


def _copy(dest: Path, rev: str) -> None:
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)


def _explore(tree: Path, seeds: int, workers: int) -> dict:
    cmd = [str(REPO / ".venv" / "bin" / "python"), "-m", "tests.explorer", "--db", "sqlite",
           "--seeds", f"0:{seeds}", "--named", "all", "--workers", str(workers)]
    p = subprocess.run(cmd, cwd=tree, capture_output=True, text=True)
    lines = p.stdout.splitlines()
    summary = next((json.loads(x) for x in reversed(lines) if x.startswith("{")), {})
    failed = [x for x in lines if x.startswith("FAILED ")]
    return {"rc": p.returncode, "seeds": sum(1 for x in failed if x.startswith("FAILED random")),
            "named": sorted({x.split()[1] for x in failed if not x.startswith("FAILED random")}),
            "example": failed[0][:200] if failed else "", "summary": summary,
            "error": p.stderr[-400:] if not summary else ""}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=300, help="random seeds 0..N-1 per mutation")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--no-baseline", action="store_true")
    ap.add_argument("--rev", default="HEAD", help="the commit every copy is made from (resolved once: "
                    "commits landing during the run do not mix into it)")
    ap.add_argument("only", nargs="*", help="mutation names (the patches' names without .patch)")
    a = ap.parse_args(argv)
    patches = sorted(HERE.glob("*.patch"))
    if a.only:
        patches = [p for p in patches if p.stem in a.only]
    runs = ([] if a.no_baseline else [None]) + patches
    rev = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", a.rev], capture_output=True, text=True,
                         check=True).stdout.strip()
    print(f"mutations: {len(patches)}, seeds 0..{a.seeds - 1} and every named schedule each, on SQLite, "
          f"at {rev}", flush=True)
    print("| mutation | explorer: seeds / named | caught |\n|---|---|---|", flush=True)
    missed = 0
    for patch in runs:
        with tempfile.TemporaryDirectory(prefix="mutation-") as tmp:
            tree = Path(tmp)
            _copy(tree, rev)
            name = "baseline (no mutation)" if patch is None else patch.stem
            if patch is not None:
                applied = subprocess.run(["patch", "-p1", "--quiet", "-i", str(patch)], cwd=tree,
                                         capture_output=True, text=True)
                if applied.returncode:
                    print(f"| {name} | patch does not apply: {applied.stdout.strip()[:120]} | ? |", flush=True)
                    missed += 1
                    continue
            r = _explore(tree, a.seeds, a.workers)
        caught = bool(r["seeds"] or r["named"])  # a schedule failed (not a coverage floor, not a crash)
        named = ", ".join(r["named"]) or "0"
        cell = f"{r['seeds']} of {a.seeds} / {named}" + (f" (explorer error: {r['error']})" if r["error"] else "")
        if r["error"]:
            caught = False
        if patch is None:
            print(f"| {name} | {cell} | {'FAILS: fix this first' if caught else 'passes'} |", flush=True)
            if caught:
                return 2
            continue
        missed += not caught
        print(f"| {name} | {cell} | {'caught' if caught else 'NOT caught'} |", flush=True)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
