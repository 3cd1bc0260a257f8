"""Whole rows of an ORM model on the driver (`driver_sql`): read as transient objects, and
written from one.

For a hot path that needs a model's row as the rest of the code reads it (the claiming
node, which placement, pricing and trust all take as a `NodeRow`) without the ORM's
statement compilation, identity map and flush. The object is transient: it belongs to
no session, and what is assigned to it is written nowhere. A caller that changes the
row writes the change itself, on the driver.

The columns, and which of them are JSON, datetimes or booleans, come from the model's
table, so a column added to the model is read here too.
"""

import functools
from typing import Any, TypeVar

from sqlalchemy import JSON, Boolean, DateTime, inspect
from sqlalchemy.orm.instrumentation import manager_of_class

from gpu_share.coordinator.core.driver_sql import Row, Sql
from gpu_share.coordinator.core.orm import Base, UTCDateTime

M = TypeVar("M", bound=Base)


def whole_row(
    model: type[Base],
    rest: str,
    *,
    extra: str = "",
    extra_datetimes: tuple[str, ...] = (),
    extra_jsons: tuple[str, ...] = (),
) -> Sql:
    """`SELECT` every column of `model`'s table (qualified by its name), then `extra`
    columns (those of them that are datetimes named in `extra_datetimes`, JSON in
    `extra_jsons`), `FROM` the table, then `rest` (joins, `WHERE`, locks)."""
    return _select(model, list(model.__table__.columns), rest, extra, extra_datetimes, extra_jsons)


def some_columns(model: type[Base], keys: tuple[str, ...], rest: str) -> Sql:
    """`SELECT` the columns of `model` whose attribute keys are `keys` `FROM` its table,
    then `rest`: a row for `partial` when a read of many rows needs only these (each JSON
    column left out is a decode fewer per row)."""
    columns = [column for column in model.__table__.columns if column.key in keys]
    if len(columns) != len(set(keys)):
        unknown = set(keys) - {c.key for c in columns}
        raise ValueError(f"not columns of {model.__tablename__}: {unknown}")
    return _select(model, columns, rest)


def _select(
    model: type[Base],
    columns: list[Any],
    rest: str,
    extra: str = "",
    extra_datetimes: tuple[str, ...] = (),
    extra_jsons: tuple[str, ...] = (),
) -> Sql:
    name = str(model.__tablename__)
    return Sql(
        f"SELECT {', '.join(f'{name}.{c.name}' for c in columns)}{extra}"  # noqa: S608 (the model's names)
        f" FROM {name} {rest}",
        datetimes=[
            *(c.name for c in columns if isinstance(c.type, UTCDateTime | DateTime)),
            *extra_datetimes,
        ],
        jsons=[*(c.name for c in columns if isinstance(c.type, JSON)), *extra_jsons],
    )


def partial(model: type[M], row: Row, keys: tuple[str, ...]) -> M:
    """`transient` for a row of `some_columns(model, keys, …)`. The columns not read are
    left expired: reading one raises (`DetachedInstanceError`) rather than answer None
    for a value the row has."""
    read, booleans, unread = _some(model, keys)
    made = _made(model, row, read, booleans)
    inspect(made).expired_attributes.update(unread)
    return made


@functools.cache
def _some(
    model: type[Base], keys: tuple[str, ...]
) -> tuple[tuple[tuple[str, str], ...], tuple[str, ...], frozenset[str]]:
    """`_columns` for the columns `keys` names, and the keys of the others."""
    names, booleans = _columns(model)
    return (
        tuple((name, key) for name, key in names if key in keys),
        tuple(key for key in booleans if key in keys),
        frozenset(key for _, key in names if key not in keys),
    )


def transient(model: type[M], row: Row) -> M:
    """The model's object with `row`'s values (read with `whole_row`), in no session.

    Made as the ORM's own loading makes an object (its class manager's `new_instance`,
    then the values in its `__dict__`), not through `__init__`, which sets each column
    through its instrumented attribute: ~2 µs a row against ~35–55 µs for a node's 38
    columns. A submit makes one for every online node, so the columns' names come from
    `_columns`, worked out once a model."""
    return _made(model, row, *_columns(model))


def _made(
    model: type[M], row: Row, names: tuple[tuple[str, str], ...], booleans: tuple[str, ...]
) -> M:
    """The object with `row`'s columns `names` ((column name, attribute key) pairs)."""
    values = {key: row[name] for name, key in names}
    for key in booleans:
        if values[key] is not None:
            values[key] = bool(values[key])  # SQLite keeps 0 and 1
    made: M = manager_of_class(model).new_instance()
    made.__dict__.update(values)
    return made


@functools.cache
def _columns(model: type[Base]) -> tuple[tuple[tuple[str, str], ...], tuple[str, ...]]:
    """The model's (column name, attribute key) pairs, and the keys of its booleans."""
    columns = model.__table__.columns
    return (
        tuple((column.name, column.key) for column in columns),
        tuple(column.key for column in columns if isinstance(column.type, Boolean)),
    )


@functools.cache
def insert_of(model: type[Base]) -> Sql:
    """The `INSERT` of one `model` row, every column named (`flushed_values` gives them)."""
    table = model.__table__
    names = [column.name for column in table.columns]
    return Sql(
        f"INSERT INTO {model.__tablename__} ({', '.join(names)})"  # noqa: S608 (the model's names)
        f" VALUES ({', '.join(f':{name}' for name in names)})",
        jsons=[c.name for c in table.columns if isinstance(c.type, JSON)],
    )


def flushed_values(obj: Base) -> dict[str, Any]:
    """An object's row for `insert_of`, as the ORM's flush makes it: what was set on it,
    else the column's default (a plain value), which is set on the object too; SQL NULL
    where there is neither. A column the database fills (a server default) and that was
    not set is refused: name it."""
    values: dict[str, Any] = {}
    for column in type(obj).__table__.columns:
        if column.key in obj.__dict__:
            values[column.name] = obj.__dict__[column.key]
        elif column.default is not None and column.default.is_scalar:
            values[column.name] = column.default.arg
            setattr(obj, column.key, column.default.arg)
        elif column.default is not None or column.server_default is not None:
            raise ValueError(f"{column.key}: set it (its default is not a plain value)")
        else:
            values[column.name] = None
    return values
