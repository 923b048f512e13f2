"""Actual state: the metadata database (SQLAlchemy Core, Alembic migrations).

``store.Store`` is the one facade the rest of the code uses; every SQL statement of the
product lives in this package. ``tables`` declares the tables, ``engine`` builds the
engines (SQLite WAL with ``BEGIN IMMEDIATE``, or PostgreSQL), ``records`` the typed rows
handed out, ``schema`` the revision check.

May import: ``control.actual``, ``control.requests``, ``control.resets`` (value types and
pure functions), ``spec.secrets`` (scrubbing) and the ground.
"""
