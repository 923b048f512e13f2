"""The actual state as the planner sees it: supervisor records read from the database.

States follow Druid's supervisor states, plus COMPLETED (bounded supervisors) and
TERMINATED; only the states this product sets are listed (Druid's STOPPING,
CONNECTING_TO_STREAM and CREATING_TASKS have no counterpart here). Frozen dataclasses
only; the store builds them, the planner reads them.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from reconciler.model import SupervisorSpec


class State(enum.StrEnum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    IDLE = "IDLE"
    SUSPENDED = "SUSPENDED"
    UNHEALTHY_SUPERVISOR = "UNHEALTHY_SUPERVISOR"
    UNHEALTHY_TASKS = "UNHEALTHY_TASKS"
    COMPLETED = "COMPLETED"
    TERMINATED = "TERMINATED"


class DetailedState(enum.StrEnum):
    PENDING = "PENDING"
    DISCOVERING_INITIAL_TASKS = "DISCOVERING_INITIAL_TASKS"
    RUNNING = "RUNNING"
    IDLE = "IDLE"
    SUSPENDED = "SUSPENDED"
    LOST_CONTACT_WITH_STREAM = "LOST_CONTACT_WITH_STREAM"
    UNABLE_TO_CONNECT_TO_STREAM = "UNABLE_TO_CONNECT_TO_STREAM"
    UNHEALTHY_SUPERVISOR = "UNHEALTHY_SUPERVISOR"
    UNHEALTHY_TASKS = "UNHEALTHY_TASKS"
    COMPLETED = "COMPLETED"
    TERMINATED = "TERMINATED"


class Kind(enum.StrEnum):
    MAIN = "main"
    BACKFILL = "backfill"


@dataclass(frozen=True)
class SupervisorRecord:
    id: str
    kind: Kind
    spec_document: Mapping[str, Any]
    spec_hash: str
    state: State
    detailed_state: DetailedState
    epoch: int
    parent_id: str | None = None
    spec_path: str | None = None
    last_request: str | None = None
    spec_error: str | None = None  # written by apply (mark-invalid), cleared by a valid file
    runtime_error: str | None = None  # written by the runtime, cleared by its next success
    last_attempted_hash: str | None = None
    start_offsets: Mapping[str, int] | None = None
    end_offsets: Mapping[str, int] | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    generation: int = 0  # source generations: a fresh start begins a new one (verify keeps them apart)

    @property
    def spec(self) -> SupervisorSpec:
        return SupervisorSpec.from_document(self.spec_document)

    @property
    def last_error(self) -> str | None:
        """What an operator should look at first: the spec file's error, else the runtime's."""
        return self.spec_error or self.runtime_error

    @property
    def bounded(self) -> bool:
        return self.end_offsets is not None

    @property
    def suspended(self) -> bool:
        return self.state == State.SUSPENDED


@dataclass(frozen=True)
class Override:
    """An operator's suspension of a supervisor, kept until lifted (drift from the file)."""

    supervisor_id: str
    kind: str  # suspend
    reason: str
    actor: str
    at: datetime

    def describe(self) -> str:
        return f"suspended by operator {self.actor} at {self.at:%Y-%m-%d %H:%M}Z: {self.reason}"


@dataclass(frozen=True)
class ActualState:
    """Everything the planner needs from the database, read in one transaction."""

    supervisors: Mapping[str, SupervisorRecord] = field(default_factory=dict)
    handled_tokens: frozenset[str] = frozenset()
    checkpoints: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    overrides: Mapping[str, Override] = field(default_factory=dict)

    def mains(self) -> dict[str, SupervisorRecord]:
        return {k: v for k, v in self.supervisors.items() if v.kind == Kind.MAIN}

