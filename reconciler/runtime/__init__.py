"""Supervisor runtimes: they ingest ranges and publish; they never decide policy."""
