"""Write scripts/mutations/*.patch from HEAD's files: one replacement each (the smallest
change that removes the mechanism), with its context, so that a patch applies while the
code around it moves. Run from the repository root after a replacement no longer matches."""

import difflib
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent

# (patch name, file, the text replaced, what replaces it)
M = [
 ("01-publish-ignores-epoch", "reconciler/store/batches.py",
  "sa.update(supervisors).where(supervisors.c.id == supervisor_id, supervisors.c.epoch == epoch)",
  "sa.update(supervisors).where(supervisors.c.id == supervisor_id)"),
 ("02-recovery-deletes-without-fencing", "reconciler/runtime/recovery.py",
  "            if store.fence_write(intent.write_id):\n",
  "            if intent.write_id:\n"),
 ("03-batch-writer-no-fsync", "reconciler/pipeline/segments.py",
  "    fsync: bool = True,\n) -> WrittenBatch:", "    fsync: bool = False,\n) -> WrittenBatch:"),
 ("04-compaction-output-not-fsynced", "reconciler/table/compact.py",
  "                durable.sync([local_path(f.file_path) for f in new_files], _dirs_up_to_data(table, new_files))",
  "                pass"),
 ("05-expiry-keeps-only-current", "reconciler/table/expire.py",
  "        protected = {ref.snapshot_id for ref in metadata.refs.values()}\n",
  "        protected = set()\n"),
 ("06-reset-to-latest-moves-back", "reconciler/control/resets.py",
  "            out.append(PartitionReset(p, c, lo, hi, c))  # the broker under-reported its end",
  "            out.append(PartitionReset(p, c, lo, hi, target, reread=c - target))"),
 ("07-backfill-starts-at-checkpoint-plus-one", "reconciler/control/resets.py",
  "            start = min(max(c, lo), target)", "            start = min(max(c + 1, lo), target)"),
 ("08-standby-recovers-under-live-lease", "reconciler/daemon/leadership.py",
  "        if self.lease_token is None:\n            self._note_standby()\n",
  "        if self.lease_token is None:\n            recover(self.store, self._settings().warehouse)\n            self._note_standby()\n"),
 ("09-fenced-write-still-commits", "reconciler/store/writes.py",
  "sa.delete(writes).where(writes.c.write_id == write_id, writes.c.status == WRITING)",
  "sa.delete(writes).where(writes.c.write_id == write_id)"),
 ("10-publish-ignores-leader-lease", "reconciler/store/batches.py",
  "            if lease is not None:\n                self._check_lease(c, *lease)",
  "            if False:\n                self._check_lease(c, *lease)"),
 ("11-reset-reads-checkpoints-before-its-transaction", "reconciler/store/requests.py",
  "        current = self._checkpoints(c, request.supervisor_id)\n",
  "        current = dict(self._stale)\n"),
]
# A second replacement in the same file, for the mutations that need one.
EXTRA = {"05-expiry-keeps-only-current": (
  "        protected |= {s.snapshot_id for s in newest[:retain_last]}\n", ""),
"11-reset-reads-checkpoints-before-its-transaction": (
  "            faults.point(\"reset-begin\", request.supervisor_id)\n",
  "            with self._read() as r:\n                self._stale = self._checkpoints(r, request.supervisor_id)\n"
  "            faults.point(\"reset-begin\", request.supervisor_id)\n")}


def main() -> None:
    for name, path, old, new in M:
        src = subprocess.run(["git", "show", f"HEAD:{path}"], capture_output=True, text=True, check=True).stdout
        replacements = [(old, new)] + ([EXTRA[name]] if name in EXTRA else [])
        out = src
        for o, n in replacements:
            if out.count(o) != 1:
                raise SystemExit(f"{name}: the text to replace is in {path} {out.count(o)} times, not once: "
                                 "update its replacement here to the code as it is now")
            out = out.replace(o, n)
        diff = difflib.unified_diff(src.splitlines(True), out.splitlines(True), f"a/{path}", f"b/{path}", n=3)
        (HERE / f"{name}.patch").write_text("".join(diff))
        print(name)


if __name__ == "__main__":
    main()
