"""Hot statements on the driver itself: asyncpg on PostgreSQL, aiosqlite on SQLite.

A statement through SQLAlchemy costs this process ~100–190 µs of CPU; the same on
asyncpg ~15 µs (`bench/statement_cost.py`). The statements every node sends every few
seconds (its heartbeat) and every job sends (its submit, its claim, its result) are
therefore written as SQL and run on the driver's connection: a transaction of their own
taken from the same pool as every other (`Database.driver_write`), or the write session's
own transaction (`db.driver_of`), where the ORM's cold statements (the ledger, webhooks)
join them. Everything else stays on the ORM: this is for paths whose cost is counted
per node and per second or per job, and each such statement keeps its SQLAlchemy-era
behaviour, pinned by tests on both databases. Whole rows of a model: `driver_models`.

A statement is written once with `:name` parameters (`Sql`). asyncpg gets it as `$1…`
and prepares it once per connection (its statement cache); sqlite3 takes `:name` as is.
Values are what SQLAlchemy's column types make of them, so rows written here and rows
written by the ORM read alike: aware UTC datetimes (naive UTC text on SQLite, as
SQLAlchemy stores them), JSON as text (the asyncpg codec SQLAlchemy installs decodes
it on the way back). A `Sql` names the columns of its result that are datetimes or
JSON, and a row comes back with the same Python values on both databases.

Driver errors become SQLAlchemy's (`IntegrityError`, `DataError`, `OperationalError`),
so the application answers them as it answers the ORM's: one error family.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import sqlite3
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import UTC, datetime
from typing import Any, Protocol

import asyncpg
from sqlalchemy import exc

_PARAM = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")
"""`:name`, but not `::type` (a PostgreSQL cast) or a name's inside."""

SQLITE_DATETIME = "%Y-%m-%d %H:%M:%S.%f"
"""How SQLAlchemy's `DateTime` stores a value on SQLite (compared as text there)."""


class Sql:
    """One statement, written with `:name` parameters; kept at module level and built once."""

    __slots__ = ("datetimes", "jsons", "pg_names", "pg_text", "text")

    def __init__(
        self, text: str, *, datetimes: Iterable[str] = (), jsons: Iterable[str] = ()
    ) -> None:
        self.text = text
        self.datetimes = frozenset(datetimes)
        self.jsons = frozenset(jsons)
        names: list[str] = []

        def number(match: re.Match[str]) -> str:
            name = match.group(1)
            if name not in names:
                names.append(name)
            return f"${names.index(name) + 1}"

        self.pg_text = _PARAM.sub(number, text)
        self.pg_names = tuple(names)

    def __repr__(self) -> str:
        return f"Sql({' '.join(self.text.split())[:80]!r})"


def sql_list(constants: Iterable[str]) -> str:
    """Constants of the code (statuses), never input, as an SQL list: `'a', 'b'`."""
    quoted = []
    for constant in constants:
        if not constant.replace("_", "").isalnum():
            raise ValueError(f"{constant!r} is not a plain constant")
        quoted.append(f"'{constant}'")
    return ", ".join(quoted)


class Row(Protocol):
    def __getitem__(self, key: str, /) -> Any: ...


class DriverTx(Protocol):
    """Statements on the driver's connection: one write transaction
    (`Database.driver_write`), or reads each on its own (`Database.driver_read`)."""

    dialect: str
    """"postgresql" or "sqlite": where a statement has a form for each."""

    async def fetch(self, sql: Sql, **params: Any) -> list[Row]: ...

    async def fetchrow(self, sql: Sql, **params: Any) -> Row | None: ...

    async def execute(self, sql: Sql, **params: Any) -> int:
        """Runs `sql`; returns the rows it wrote (an INSERT, UPDATE or DELETE)."""
        ...


def _json_text(value: Any) -> Any:
    return value if value is None else json.dumps(value)


class PostgresTx:
    """asyncpg: aware datetimes as they are; JSON as text, decoded on the way back by the
    codec SQLAlchemy installs on each connection."""

    dialect = "postgresql"

    def __init__(
        self, connection: asyncpg.Connection, *, most_statements: int | None = None
    ) -> None:
        self._connection = connection
        self._left = most_statements

    def _args(self, sql: Sql, params: Mapping[str, Any]) -> list[Any]:
        if self._left is not None:
            if self._left == 0:
                raise RuntimeError(f"{sql!r}: one statement was allowed outside a transaction")
            self._left -= 1
        return [
            _json_text(params[name]) if name in sql.jsons else params[name] for name in sql.pg_names
        ]

    async def fetch(self, sql: Sql, **params: Any) -> list[Row]:
        with _as_sqlalchemy_errors(sql):
            return list(await self._connection.fetch(sql.pg_text, *self._args(sql, params)))

    async def fetchrow(self, sql: Sql, **params: Any) -> Row | None:
        with _as_sqlalchemy_errors(sql):
            row: Row | None = await self._connection.fetchrow(sql.pg_text, *self._args(sql, params))
            return row

    async def execute(self, sql: Sql, **params: Any) -> int:
        with _as_sqlalchemy_errors(sql):
            status: str = await self._connection.execute(sql.pg_text, *self._args(sql, params))
        # "UPDATE 1", "INSERT 0 1", "DELETE 3": the count comes last
        count = status.rpartition(" ")[2]
        return int(count) if count.isdigit() else 0


def sqlite_value(value: Any) -> Any:
    """A parameter as SQLAlchemy's types store it on SQLite."""
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        return value.astimezone(UTC).strftime(SQLITE_DATETIME)
    return value


def _sqlite_datetime(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text).replace(tzinfo=UTC)


class SqliteTx:
    """aiosqlite: datetimes as naive UTC text and JSON as text, both ways."""

    dialect = "sqlite"

    def __init__(self, connection: Any) -> None:
        self._connection = connection

    @staticmethod
    def _args(sql: Sql, params: Mapping[str, Any]) -> dict[str, Any]:
        return {
            name: _json_text(value) if name in sql.jsons else sqlite_value(value)
            for name, value in params.items()
        }

    @staticmethod
    def _row(sql: Sql, names: list[str], values: tuple[Any, ...]) -> dict[str, Any]:
        row = dict(zip(names, values, strict=True))
        for name in sql.datetimes & row.keys():
            row[name] = _sqlite_datetime(row[name])
        for name in sql.jsons & row.keys():
            if row[name] is not None:
                row[name] = json.loads(row[name])
        return row

    async def fetch(self, sql: Sql, **params: Any) -> list[Row]:
        with _as_sqlalchemy_errors(sql):
            async with self._connection.execute(sql.text, self._args(sql, params)) as cursor:
                values = await cursor.fetchall()
                names = [column[0] for column in cursor.description or ()]
        return [self._row(sql, names, value) for value in values]

    async def fetchrow(self, sql: Sql, **params: Any) -> Row | None:
        rows = await self.fetch(sql, **params)
        return rows[0] if rows else None

    async def execute(self, sql: Sql, **params: Any) -> int:
        with _as_sqlalchemy_errors(sql):
            async with self._connection.execute(sql.text, self._args(sql, params)) as cursor:
                written: int = cursor.rowcount
        return max(written, 0)


def postgres_transaction(connection: asyncpg.Connection) -> AbstractAsyncContextManager[DriverTx]:
    """BEGIN, then COMMIT, or ROLLBACK if the block fails (`_transaction`).

    Written as the statements, not asyncpg's `Transaction`: one cancelled while its BEGIN
    is on its way (a request or a loop stopped at shutdown) stays marked as the
    connection's open transaction, so the next on that pooled connection became a
    SAVEPOINT inside the one the server had begun, and its "commit" released the
    savepoint and committed nothing."""
    return _transaction(connection, "BEGIN", PostgresTx(connection))


def sqlite_transaction(connection: Any) -> AbstractAsyncContextManager[DriverTx]:
    """`BEGIN IMMEDIATE`, as every write transaction on SQLite (`Database.write`), then
    COMMIT, or ROLLBACK if the block fails (`_transaction`). aiosqlite runs a cancelled
    BEGIN in its thread all the same: left open, the connection would go back to the pool
    holding the database's write lock, every other writer waiting out the busy timeout."""
    return _transaction(connection, "BEGIN IMMEDIATE", SqliteTx(connection))


@asynccontextmanager
async def _transaction(connection: Any, begin: str, tx: DriverTx) -> AsyncIterator[DriverTx]:
    """`begin`, the block, COMMIT. Anything that ends it early, a cancel while the BEGIN
    or the COMMIT is on its way included, sends a ROLLBACK, shielded from a second cancel:
    either driver runs it after the statement before it (one queue per connection), and
    one with nothing to roll back is no error to the caller. The connection goes back to
    the pool with no transaction open. (A COMMIT cancelled on its way may have committed:
    as with a connection lost then, the caller cannot know.)"""
    try:
        with _as_sqlalchemy_errors(None):
            await connection.execute(begin)
        yield tx
        with _as_sqlalchemy_errors(None):
            await connection.execute("COMMIT")
    except BaseException:
        # The block's own error is the one to raise, not the ROLLBACK's (a dead
        # connection's, or SQLite's "no transaction is active").
        with contextlib.suppress(Exception):
            await asyncio.shield(connection.execute("ROLLBACK"))
        raise


def driver_errors() -> _as_sqlalchemy_errors:
    """Around a driver call outside a statement (a transaction's COMMIT): its errors as
    SQLAlchemy's, as a statement's are."""
    return _as_sqlalchemy_errors(None)


class _as_sqlalchemy_errors:
    """The driver's errors as SQLAlchemy's, which the application already answers."""

    __slots__ = ("_statement",)

    def __init__(self, sql: Sql | None) -> None:
        self._statement = sql.text if sql is not None else "(transaction)"

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, _tb: Any
    ) -> None:
        if error is None or not isinstance(error, Exception):
            return
        wrapper = _wrapper_for(error)
        if wrapper is not None:
            raise wrapper(self._statement, None, error) from error


def _wrapper_for(error: Exception) -> type[exc.DBAPIError] | None:
    if isinstance(error, asyncpg.IntegrityConstraintViolationError | sqlite3.IntegrityError):
        return exc.IntegrityError
    if isinstance(error, asyncpg.DataError | sqlite3.DataError):
        return exc.DataError
    if isinstance(
        error,
        asyncpg.PostgresError | asyncpg.InterfaceError | sqlite3.Error | OSError,
    ):
        return exc.OperationalError
    return None
