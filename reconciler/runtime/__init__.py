"""Supervisor runtimes: they ingest ranges and publish; they never decide policy.

``supervisor`` (one supervisor's step: cut, ingest, publish), ``manager`` (the threads
that step them, and the step time limit), ``batching`` (ranges and budgets), ``recovery`` (the leader's start-up
clean-up), ``compactor`` (the leader's maintenance loop).

May import: ``pipeline``, ``table``, ``store``, ``streams``, ``control.positions`` and
the ground. Imported by ``daemon`` only.
"""
