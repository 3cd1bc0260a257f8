"""The inputs NPZ of a CatBoost training (SPEC §1.6), checked and shaped for CatBoost.

Two layouts of the features:

- `X`: one 2-D array, rows × features. Numeric, or str when some columns are
  categorical; then the other columns are parsed as numbers. `X_eval` has the
  same columns. Names come from the config's `feature_names`, if any.
- One 1-D array per feature, named after the feature: every array whose name is
  not reserved below. Their order is `feature_names` when the config gives it
  (the NPZ must then hold exactly those), else the NPZ's own order. Eval columns
  are named `X_eval/<feature>`.

Reserved names: `X`, `y`, `X_eval`, `y_eval`, `group_id`, `group_id_eval`,
`weight`, `weight_eval`. `y` is 1-D (or 2-D for multi-target losses); labels may
be strings for classification. Categorical columns hold integers or strings
(floats with integral values are taken as integers). `group_id` (integers or
strings) is required for ranking; a group's rows need not be adjacent, they are
gathered in order of first appearance. Without `X_eval`, `eval_fraction` splits
an eval set off with the config's `random_seed` (whole groups, for ranking).

Every problem is an `INVALID_INPUTS` naming the array, what was expected and
what was found. Nothing here imports CatBoost.
"""

import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpu_share.agent.runtimes.catboost_config import TrainConfig
from gpu_share.agent.runtimes.npz import Array, describe
from gpu_share.agent.runtimes.runner import FailureCode, JobFailure

EVAL_PREFIX = "X_eval/"
TARGETS = ("y", "y_eval", "group_id", "group_id_eval", "weight", "weight_eval")
RESERVED = frozenset({"X", "X_eval", *TARGETS})


@dataclass(frozen=True)
class Split:
    """Train or eval rows: features as a numeric array or a pandas DataFrame."""

    features: Any
    label: Array
    group_id: Array | None = None
    weight: Array | None = None

    @property
    def rows(self) -> int:
        return len(self.label)

    def take(self, rows: Array) -> "Split":
        features = self.features
        features = (
            features.iloc[rows].reset_index(drop=True) if _is_frame(features) else features[rows]
        )
        return Split(
            features=features,
            label=self.label[rows],
            group_id=None if self.group_id is None else self.group_id[rows],
            weight=None if self.weight is None else self.weight[rows],
        )


@dataclass(frozen=True)
class TrainingData:
    train: Split
    eval: Split | None
    feature_names: list[str] | None  # None: CatBoost's defaults ("0", "1", …)
    cat_features: list[int]
    eval_source: str | None  # "X_eval", "eval_fraction" or None

    @property
    def width(self) -> int:
        return int(self.train.features.shape[1])


@dataclass(frozen=True)
class _Table:
    """The raw feature columns of X or X_eval, before conversion."""

    name: str  # "X" or "X_eval"
    columns: list[Array]
    matrix: Array | None  # the 2-D array itself, when the layout is one
    per_feature: bool

    def where(self, index: int, names: Sequence[str] | None) -> str:
        if self.per_feature and names is not None:
            prefix = EVAL_PREFIX if self.name == "X_eval" else ""
            return f'feature "{prefix}{names[index]}"'
        named = f' ("{names[index]}")' if names is not None else ""
        return f"{self.name} column {index}{named}"


def _bad(message: str) -> JobFailure:
    return JobFailure(FailureCode.INVALID_INPUTS, message)


def training_data(arrays: dict[str, Array], config: TrainConfig) -> TrainingData:
    """Raises `JobFailure` (INVALID_INPUTS, or INVALID_CONFIG for a config/data conflict)."""
    if "y" not in arrays:
        raise _bad(
            "the inputs NPZ has no y (the target): save it with numpy.savez(f, X=X, y=y); "
            f"it holds {_listing(arrays)}"
        )
    train_table, eval_table, names = _tables(arrays, config)
    rows = _rows(train_table, names)
    if rows < 2:
        raise _bad(f"a {rows}-row data set cannot be split/trained: give at least 2 rows")
    cat = _cat_indices(config, names, len(train_table.columns))
    train = Split(
        features=_features(train_table, cat, names),
        label=_label(arrays["y"], "y", rows, config.task),
        group_id=_group_id(arrays.get("group_id"), "group_id", rows),
        weight=_weight(arrays.get("weight"), "weight", rows),
    )
    if config.task == "ranking" and train.group_id is None:
        raise _bad("task ranking needs group_id: one query/group id per row of X")

    evaluation, source = _eval_split(arrays, eval_table, config, cat, names)
    if evaluation is None and config.eval_fraction is not None:
        train, evaluation = _split_off(train, config)
        source = "eval_fraction"
    if config.task == "ranking":
        train = _grouped(train)
        evaluation = None if evaluation is None else _grouped(evaluation)
    return TrainingData(
        train=train,
        eval=evaluation,
        feature_names=names,
        cat_features=cat,
        eval_source=source,
    )


# Features


def _tables(
    arrays: dict[str, Array], config: TrainConfig
) -> tuple[_Table, _Table | None, list[str] | None]:
    names = config.feature_names
    if "X" in arrays:
        unexpected = [name for name in arrays if name not in RESERVED]
        if unexpected:
            raise _bad(
                f"unexpected arrays {_quoted(unexpected)} next to X: with X (rows × features) "
                f"the NPZ holds only {', '.join(sorted(RESERVED))}; to give one array per "
                "feature, leave X out"
            )
        train = _matrix_table("X", arrays["X"])
        if names is not None and len(names) != len(train.columns):
            raise _bad(
                f"feature_names has {len(names)} names but X has {len(train.columns)} columns"
            )
        evaluation = None
        if "X_eval" in arrays:
            evaluation = _matrix_table("X_eval", arrays["X_eval"])
            if len(evaluation.columns) != len(train.columns):
                raise _bad(
                    f"X_eval has {len(evaluation.columns)} columns but X has "
                    f"{len(train.columns)}: the eval rows need the same features"
                )
        return train, evaluation, names

    if "X_eval" in arrays:
        raise _bad(
            "X_eval is given without X: with one array per feature, name the eval columns "
            f"{EVAL_PREFIX}<feature>"
        )
    found = [n for n in arrays if n not in RESERVED and not n.startswith(EVAL_PREFIX)]
    if not found:
        raise _bad(
            "the inputs NPZ holds no features: save X (rows × features) or one 1-D array per "
            f"feature, plus y; it holds {_listing(arrays)}"
        )
    if names is not None:
        missing = [n for n in names if n not in found]
        extra = [n for n in found if n not in names]
        if missing or extra:
            problems = ([f"missing {_quoted(missing)}"] if missing else []) + (
                [f"unexpected {_quoted(extra)}"] if extra else []
            )
            raise _bad(
                f"the feature arrays do not match feature_names ({'; '.join(problems)}); "
                f"feature_names: {_quoted(names)}"
            )
    names = list(names or found)
    for name in names:
        if arrays[name].ndim != 1:
            raise _bad(
                f'feature "{name}" must be a 1-D array (one value per row), '
                f"got {describe(arrays[name])}"
            )
    train = _Table("X", [arrays[n] for n in names], None, per_feature=True)
    eval_names = [n for n in arrays if n.startswith(EVAL_PREFIX)]
    if not eval_names:
        return train, None, names
    expected = [EVAL_PREFIX + n for n in names]
    missing = [n for n in expected if n not in arrays]
    extra = [n for n in eval_names if n not in expected]
    if missing or extra:
        problems = ([f"missing {_quoted(missing)}"] if missing else []) + (
            [f"unexpected {_quoted(extra)}"] if extra else []
        )
        raise _bad(
            f"the eval columns do not match the features ({'; '.join(problems)}): give one "
            f"{EVAL_PREFIX}<feature> array per feature"
        )
    for name in expected:
        if arrays[name].ndim != 1:
            raise _bad(f'feature "{name}" must be a 1-D array, got {describe(arrays[name])}')
    return train, _Table("X_eval", [arrays[n] for n in expected], None, True), names


def _matrix_table(name: str, matrix: Array) -> _Table:
    if matrix.ndim != 2:
        hint = f"; for a single feature use {name}.reshape(-1, 1)" if matrix.ndim == 1 else ""
        raise _bad(f"{name} must be 2-D (rows × features), got {describe(matrix)}{hint}")
    if matrix.shape[1] == 0:
        raise _bad(f"{name} has no columns ({describe(matrix)}): give at least one feature")
    return _Table(name, [matrix[:, j] for j in range(matrix.shape[1])], matrix, False)


def _rows(table: _Table, names: list[str] | None) -> int:
    rows = len(table.columns[0])
    for index, column in enumerate(table.columns[1:], start=1):
        if len(column) != rows:
            raise _bad(
                f"{table.where(index, names)} has {len(column)} rows but "
                f"{table.where(0, names)} has {rows}"
            )
    return rows


def _cat_indices(config: TrainConfig, names: list[str] | None, width: int) -> list[int]:
    indices = []
    for item in config.cat_features:
        if isinstance(item, int):
            if item >= width:
                raise _bad(f"cat_features index {item} is out of range for X with {width} columns")
            indices.append(item)
        elif names is None:
            raise JobFailure(
                FailureCode.INVALID_CONFIG,
                f'cat_features names a feature ("{item}") but the features have no names: '
                "give feature_names, or list column indices",
            )
        elif item not in names:
            raise _bad(f'cat_features names "{item}", which is not a feature: {_quoted(names)}')
        else:
            indices.append(names.index(item))
    if len(set(indices)) != len(indices):
        raise JobFailure(FailureCode.INVALID_CONFIG, "cat_features lists a column twice")
    return sorted(indices)


def _features(table: _Table, cat: list[int], names: list[str] | None) -> Any:
    """A float array when every feature is numeric, else a DataFrame CatBoost reads by column."""
    matrix = table.matrix
    if not cat and matrix is not None and matrix.dtype.kind in "iuf":
        return matrix
    columns = [
        _categorical(column, table.where(j, names))
        if j in cat
        else _numeric(column, table.where(j, names))
        for j, column in enumerate(table.columns)
    ]
    if not cat:
        return np.column_stack(columns)
    pd: Any = importlib.import_module("pandas")  # CatBoost's dependency; for mixed columns

    labels = names or [str(j) for j in range(len(columns))]
    return pd.DataFrame(dict(zip(labels, columns, strict=True)), copy=False)


def _numeric(column: Array, where: str) -> Array:
    kind = column.dtype.kind
    if kind in "iuf":
        return column
    if kind == "b":
        return column.astype(np.float32)
    if kind in "US":
        text = _text(column, where)
        try:
            return text.astype(np.float64)
        except ValueError:
            row = next(i for i, value in enumerate(text) if not _is_number(value))
            raise _bad(
                f"{where} holds {str(text[row])!r} at row {row}, which is not a number; "
                "list the column in cat_features if it is categorical"
            ) from None
    raise _bad(f"{where} is {describe(column)}: features must be numbers or strings")


def _categorical(column: Array, where: str) -> Array:
    kind = column.dtype.kind
    if kind in "biu":
        return column.astype(np.int64)
    if kind in "US":
        return _text(column, where)
    if kind == "f":
        values = column.astype(np.float64)
        bad = np.flatnonzero(~np.isfinite(values))
        if bad.size:
            raise _bad(
                f"{where} holds {values[bad[0]]} at row {bad[0]}: a categorical value cannot be "
                'NaN or infinite; use a string such as "missing"'
            )
        fractional = np.flatnonzero(values != np.round(values))
        if fractional.size:
            raise _bad(
                f"{where} holds {values[fractional[0]]} at row {fractional[0]}: categorical "
                "values must be integers or strings"
            )
        return values.astype(np.int64)
    raise _bad(f"{where} is {describe(column)}: categorical values must be integers or strings")


def _text(column: Array, where: str) -> Array:
    if column.dtype.kind == "U":
        return column
    try:
        return np.char.decode(column.astype(np.bytes_), "utf-8")
    except UnicodeDecodeError as exc:
        raise _bad(f"{where} holds bytes that are not UTF-8 text: {exc}") from exc


def _is_number(value: Any) -> bool:
    try:
        float(value)
    except ValueError:
        return False
    return True


# Targets, groups and weights


def _label(y: Array, name: str, rows: int, task: str) -> Array:
    source = "X" if name == "y" else "X_eval"
    if y.ndim not in (1, 2) or (task == "ranking" and y.ndim != 1):
        shape = "1-D (one target per row)" + ("" if task == "ranking" else " or 2-D")
        raise _bad(f"{name} must be {shape}, got {describe(y)}")
    if len(y) != rows:
        raise _bad(f"{name} has {len(y)} rows but {source} has {rows}")
    kind = y.dtype.kind
    if kind in "US":
        if task != "classification":
            raise _bad(f"{name} holds strings ({describe(y)}), but task {task} needs numbers")
        return _text(y, name)
    if kind == "b":
        return y.astype(np.int64)
    if kind == "f":
        bad = np.flatnonzero(~np.isfinite(y).reshape(len(y), -1).all(axis=1))
        if bad.size:
            value = "NaN" if np.isnan(y[bad[0]]).any() else "an infinite value"
            raise _bad(f"{name} contains {value} at row {bad[0]}")
        return y
    if kind in "iu":
        return y
    raise _bad(f"{name} is {describe(y)}: the target must be numbers (or strings for classes)")


def _group_id(groups: Array | None, name: str, rows: int) -> Array | None:
    if groups is None:
        return None
    source = "X" if name == "group_id" else "X_eval"
    if groups.ndim != 1 or len(groups) != rows:
        raise _bad(
            f"{name} must be 1-D with one id per row of {source} ({rows}), got {describe(groups)}"
        )
    kind = groups.dtype.kind
    if kind in "iu":
        return groups.astype(np.int64)
    if kind in "US":
        return _text(groups, name)
    if kind == "f":
        values = groups.astype(np.float64)
        if np.isfinite(values).all() and (values == np.round(values)).all():
            return values.astype(np.int64)
    raise _bad(f"{name} is {describe(groups)}: group ids must be integers or strings")


def _weight(weight: Array | None, name: str, rows: int) -> Array | None:
    if weight is None:
        return None
    source = "X" if name == "weight" else "X_eval"
    if weight.ndim != 1 or len(weight) != rows:
        raise _bad(
            f"{name} must be 1-D with one weight per row of {source} ({rows}), "
            f"got {describe(weight)}"
        )
    if weight.dtype.kind not in "iuf":
        raise _bad(f"{name} is {describe(weight)}: weights must be numbers")
    values = weight.astype(np.float64)
    bad = np.flatnonzero(~np.isfinite(values) | (values < 0))
    if bad.size:
        raise _bad(f"{name} holds {values[bad[0]]} at row {bad[0]}: weights must be finite and ≥ 0")
    return values


# Eval set


def _eval_split(
    arrays: dict[str, Array],
    table: _Table | None,
    config: TrainConfig,
    cat: list[int],
    names: list[str] | None,
) -> tuple[Split | None, str | None]:
    if table is None:
        given = [name for name in ("y_eval", "group_id_eval", "weight_eval") if name in arrays]
        if given:
            raise _bad(f"{_quoted(given)} given without X_eval")
        return None, None
    if config.eval_fraction is not None:
        raise JobFailure(
            FailureCode.INVALID_CONFIG,
            "eval_fraction is set but the inputs hold an eval set (X_eval); remove one of them",
        )
    if "y_eval" not in arrays:
        raise _bad("X_eval is given without y_eval: give the eval targets too")
    rows = _rows(table, names)
    if rows == 0:
        raise _bad("X_eval has no rows")
    evaluation = Split(
        features=_features(table, cat, names),
        label=_label(arrays["y_eval"], "y_eval", rows, config.task),
        group_id=_group_id(arrays.get("group_id_eval"), "group_id_eval", rows),
        weight=_weight(arrays.get("weight_eval"), "weight_eval", rows),
    )
    if config.task == "ranking" and evaluation.group_id is None:
        raise _bad("task ranking needs group_id_eval with X_eval: one group id per eval row")
    return evaluation, "X_eval"


def _split_off(train: Split, config: TrainConfig) -> tuple[Split, Split]:
    fraction = config.eval_fraction
    assert fraction is not None
    random = np.random.RandomState(config.seed % 2**32)
    if config.task == "ranking" and train.group_id is not None:
        groups, membership = np.unique(train.group_id, return_inverse=True)
        if len(groups) < 2:
            raise _bad("eval_fraction splits off whole groups, and group_id has only one group")
        count = min(len(groups) - 1, max(1, round(len(groups) * fraction)))
        is_eval = np.isin(membership, random.permutation(len(groups))[:count])
    else:
        count = min(train.rows - 1, max(1, round(train.rows * fraction)))
        is_eval = np.zeros(train.rows, dtype=bool)
        is_eval[random.permutation(train.rows)[:count]] = True
    kept = np.flatnonzero(~is_eval)
    if len(kept) < 2:
        raise _bad(
            f"eval_fraction {fraction} of {train.rows} rows leaves {len(kept)} row to train on; "
            "give more rows or a smaller eval_fraction"
        )
    return train.take(kept), train.take(np.flatnonzero(is_eval))


def _grouped(split: Split) -> Split:
    """The rows with each group's rows adjacent (CatBoost's rule), groups in first-seen order."""
    groups = split.group_id
    assert groups is not None
    _, first, membership = np.unique(groups, return_index=True, return_inverse=True)
    if np.count_nonzero(groups[1:] != groups[:-1]) + 1 == len(first):
        return split
    return split.take(np.argsort(first[membership], kind="stable"))


# Messages


def _is_frame(features: Any) -> bool:
    return hasattr(features, "iloc")


def _quoted(names: Sequence[str]) -> str:
    return ", ".join(f'"{name}"' for name in names)


def _listing(arrays: dict[str, Array]) -> str:
    return ", ".join(f"{name}: {describe(a)}" for name, a in arrays.items()) or "nothing"
