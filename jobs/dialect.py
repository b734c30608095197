"""The few places where PostgreSQL and SQLite need different SQL or parameters.

Raw SQL in ``jobs.transitions`` talks to both through these helpers, so the
statements themselves stay identical where the two databases agree.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID  # not ``import uuid``: ``Dialect.uuid`` shadows it in the class body

from django.db import connections
from django.utils import timezone
from django.utils.dateparse import parse_datetime


@dataclass(frozen=True)
class Now:
    """An assignment or comparison meaning "the database's time plus ``seconds``"."""

    seconds: float = 0.0


@dataclass(frozen=True)
class Dialect:
    alias: str = "default"

    @property
    def connection(self):
        return connections[self.alias]

    @property
    def postgres(self) -> bool:
        return self.connection.vendor == "postgresql"

    # Parameter adapters -------------------------------------------------
    def uuid(self, value: UUID | str | None) -> Any:
        """A UUID as this database stores it (native on PostgreSQL, hex on SQLite)."""
        if value is None:
            return None
        value = value if isinstance(value, UUID) else UUID(str(value))
        return value if self.postgres else value.hex

    def ts(self, value: datetime | None) -> Any:
        return self.connection.ops.adapt_datetimefield_value(value)

    @staticmethod
    def json(value: Any) -> str:
        return json.dumps(value, separators=(",", ":"))

    # SQL fragments ------------------------------------------------------
    @property
    def json_param(self) -> str:
        return "%s::jsonb" if self.postgres else "%s"

    @property
    def uuid_param(self) -> str:
        return "%s::uuid" if self.postgres else "%s"

    @property
    def new_token(self) -> str:
        return "gen_random_uuid()" if self.postgres else "lower(hex(randomblob(16)))"

    def now(self, plus: float = 0.0, *, at: datetime | None = None) -> tuple[str, list[Any]]:
        """The database's time plus ``plus`` seconds, as (SQL, params) inside a statement.

        PostgreSQL: ``statement_timestamp()``, the database server's clock, so
        processes on machines whose clocks differ agree (``jobs.clock``). SQLite
        is one machine: this process's time, ``at`` when given (one instant
        for every use in a statement), as a parameter.
        """
        if self.postgres:
            if not plus:
                return "statement_timestamp()", []
            return "(statement_timestamp() + %s * interval '1 second')", [float(plus)]
        base = at if at is not None else timezone.now()
        return "%s", [self.ts(base + timedelta(seconds=plus) if plus else base)]

    def in_list(self, n: int) -> str:
        return "(" + ", ".join(["%s"] * n) + ")"

    # Result readers ------------------------------------------------------
    @staticmethod
    def read_uuid(value: Any) -> UUID | None:
        """A nullable uuid column (``parent_id``, ``lease_token``)."""
        if value is None or isinstance(value, UUID):
            return value
        return UUID(str(value))

    @staticmethod
    def read_id(value: Any) -> UUID:
        """A uuid column that is never NULL (a job's id, a message's parent).

        ``read_uuid`` without the ``None`` case, so callers get a ``UUID``
        without narrowing a value the schema already guarantees.
        """
        return value if isinstance(value, UUID) else UUID(str(value))

    @staticmethod
    def read_json(value: Any) -> Any:
        if value is None or not isinstance(value, (str, bytes)):
            return value
        return json.loads(value)

    @staticmethod
    def read_ts(value: Any) -> datetime | None:
        if value is None or isinstance(value, datetime):
            return value
        parsed = parse_datetime(str(value))
        if parsed is not None and parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=UTC)
        return parsed


def dialect(alias: str = "default") -> Dialect:
    return Dialect(alias)


# PostgreSQL arrays sent as one text parameter (``%s::uuid[]``) ---------------
def array_literal(elements: Iterable[str]) -> str:
    """A PostgreSQL array literal, sent as one text parameter and cast in SQL.

    psycopg's list adapter quotes element by element in Python; one string is
    quoted once, in C. Elements come here already in array-literal syntax
    (``quoted_element``, ``int_element``, or ``str`` of a UUID).
    """
    return "{" + ",".join(elements) + "}"


def quoted_element(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def int_element(value: int | None) -> str:
    return "NULL" if value is None else str(int(value))
