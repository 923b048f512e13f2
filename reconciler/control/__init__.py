"""The control plane: desired state against actual state, and the difference applied.

One reconcile pass (``reconcile.reconcile_once``) loads the spec directory, reads the
database, plans and applies:

* ``actual``: the actual state's value types (supervisor records, states), built by the store;
* ``requests``: reset requests from the three triggers (stanza, marker, CLI) and their tokens;
* ``resets``: the pure reset arithmetic (where each checkpoint goes, what a backfill covers);
* ``plan``: the pure diff of desired against actual into actions (no I/O, enforced by a
  contract in pyproject.toml);
* ``positions``: capturing a stream's offsets for a reset (through ``streams``);
* ``apply``: actions into transactions, each idempotent;
* ``reconcile``: the pass, in four fixed steps.

May import: ``store``, ``streams``, ``spec`` and the ground (``model``, ``errors``,
``settings``, ``logs``, ``faults``). The store imports ``actual``, ``requests`` and
``resets`` (value types and pure functions); nothing else here.
"""
