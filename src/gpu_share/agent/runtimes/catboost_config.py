"""The CatBoost train config (SPEC §1.6): the JSON a tenant gives as `model_url`.

It is CatBoost's own keyword arguments at the top level plus the runtime's keys
(`task`, `cat_features`, `feature_names`, `eval_fraction`, `outputs`). It is
checked here, before CatBoost is imported or the data is read, so a mistake is
reported at once and names its key. What CatBoost accepts passes through; what
would reach past the job (file paths, a train directory, snapshot files, more
threads than the job's share, the device) is refused with the reason, because
the runtime sets those itself. The deeper checks of values (`loss_function`
names, `depth` limits, option combinations) are CatBoost's, made before training
starts; see `catboost.py`.
"""

import difflib
import json
from typing import Annotated, Any, Literal, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from gpu_share.agent.runtimes.runner import FailureCode, JobFailure

Task = Literal["classification", "regression", "ranking"]
OutputKind = Literal["cbm", "onnx", "json"]
DEFAULT_OUTPUTS: tuple[OutputKind, ...] = ("cbm",)

DEFAULT_ITERATIONS = 1000  # CatBoost's own default
MAX_ITERATIONS = 1_000_000
MAX_MESSAGE_CHARS = 1500
MAX_DEPTH = 8  # CatBoost's parameters nest two or three levels; deeper is not a config

CONFIG_KEYS = ("task", "cat_features", "feature_names", "eval_fraction", "outputs")

# Keyword arguments of CatBoostClassifier/Regressor/Ranker (1.2) passed through as given;
# the typed fields of `TrainConfig` are checked further.
CATBOOST_PARAMS = frozenset(
    {
        "iterations", "learning_rate", "depth", "l2_leaf_reg", "model_size_reg", "rsm",
        "loss_function", "border_count", "feature_border_type",
        "per_float_feature_quantization", "fold_permutation_block", "od_pval", "od_wait",
        "od_type", "nan_mode", "counter_calc_method", "leaf_estimation_iterations",
        "leaf_estimation_method", "thread_count", "random_seed", "use_best_model",
        "best_model_min_trees", "metric_period", "ctr_leaf_count_limit",
        "store_all_simple_ctr", "max_ctr_complexity", "has_time", "allow_const_label",
        "target_border", "classes_count", "class_weights", "auto_class_weights",
        "class_names", "one_hot_max_size", "random_strength", "random_score_type", "name",
        "ignored_features", "custom_loss", "custom_metric", "eval_metric",
        "bagging_temperature", "fold_len_multiplier", "used_ram_limit", "gpu_ram_part",
        "final_ctr_computation_mode", "approx_on_full_history", "boosting_type",
        "simple_ctr", "combinations_ctr", "per_feature_ctr", "ctr_description",
        "ctr_target_border_count", "bootstrap_type", "subsample", "mvs_reg",
        "sampling_unit", "sampling_frequency", "dev_score_calc_obj_block_size",
        "dev_efb_max_buckets", "sparse_features_conflict_fraction", "scale_pos_weight",
        "gpu_cat_features_storage", "data_partition", "metadata", "early_stopping_rounds",
        "grow_policy", "min_data_in_leaf", "max_leaves", "score_function",
        "leaf_estimation_backtracking", "ctr_history_unit", "monotone_constraints",
        "feature_weights", "penalties_coefficient", "first_feature_use_penalties",
        "per_object_feature_penalties", "model_shrink_rate", "model_shrink_mode", "langevin",
        "diffusion_temperature", "posterior_sampling", "boost_from_average",
        "fixed_binary_splits",
    }
)  # fmt: skip

# CatBoost's synonyms, stored under the canonical name so each is checked once.
ALIASES = {
    "n_estimators": "iterations",
    "num_boost_round": "iterations",
    "num_trees": "iterations",
    "eta": "learning_rate",
    "max_depth": "depth",
    "reg_lambda": "l2_leaf_reg",
    "random_state": "random_seed",
    "objective": "loss_function",
    "max_bin": "border_count",
    "colsample_bylevel": "rsm",
    "min_child_samples": "min_data_in_leaf",
    "num_leaves": "max_leaves",
}

_SNAPSHOTS = "the platform snapshots every training itself and resumes a requeued job from it"
_DEVICE = "the runtime picks the device: ask for the catboost_cuda or catboost_cpu runtime"
_FILES = "it would make CatBoost write files on the node; the runtime keeps them in the job"
_TEXT = "text and embedding features are not supported; give numeric or categorical features"

# CatBoost keywords the runtime sets itself or cannot honour, and why.
REFUSED: dict[str, str] = {
    "train_dir": _FILES,
    "allow_writing_files": _FILES,
    "save_snapshot": _SNAPSHOTS,
    "snapshot_file": _SNAPSHOTS,
    "snapshot_interval": _SNAPSHOTS,
    "input_borders": "it names a file on the node; borders cannot be loaded from a file here",
    "output_borders": "it names a file on the node to write borders to",
    "task_type": _DEVICE,
    "device_config": _DEVICE,
    "pinned_memory_size": "it sizes pinned host memory, which the node manages",
    "callback": "Python callbacks cannot be given in a JSON config",
    "text_features": _TEXT,
    "embedding_features": _TEXT,
    "tokenizers": _TEXT,
    "dictionaries": _TEXT,
    "feature_calcers": _TEXT,
    "text_processing": _TEXT,
}

# Logging keywords: the runtime prints progress about a hundred times per training.
IGNORED = frozenset({"verbose", "verbose_eval", "silent", "logging_level"})

# Keywords the runtime sets itself over the tenant's value, saying so in the log: a job
# trains on exactly the GPUs it was given (SPEC §4.3), whichever the config names.
REPLACED = frozenset({"devices"})


class TrainConfig(BaseModel):
    """The validated config; CatBoost keywords other than the typed ones are extras."""

    model_config = ConfigDict(extra="allow", strict=True)

    task: Task
    cat_features: list[int | str] = Field(default_factory=list)
    feature_names: list[Annotated[str, Field(min_length=1)]] | None = None
    eval_fraction: float | None = Field(default=None, gt=0, lt=1)
    outputs: list[OutputKind] = Field(default_factory=lambda: list(DEFAULT_OUTPUTS), min_length=1)

    iterations: int = Field(default=DEFAULT_ITERATIONS, ge=1, le=MAX_ITERATIONS)
    learning_rate: float | None = Field(default=None, gt=0)
    depth: int | None = Field(default=None, ge=1, le=16)
    l2_leaf_reg: float | None = Field(default=None, ge=0)
    random_seed: int | None = Field(default=None, ge=0, lt=2**63)
    thread_count: int | None = Field(default=None, ge=-1)
    early_stopping_rounds: int | None = Field(default=None, ge=1)
    metric_period: int | None = Field(default=None, ge=1)
    loss_function: str | None = None
    eval_metric: str | None = None

    ignored: list[str] = Field(default_factory=list, exclude=True)
    replaced: dict[str, Any] = Field(default_factory=dict, exclude=True)

    @model_validator(mode="before")
    @classmethod
    def _catboost_keys_only(cls, raw: Any) -> Any:
        if not isinstance(raw, dict):
            return raw
        keys: dict[str, Any] = {}
        given_as: dict[str, str] = {}
        ignored = []
        replaced: dict[str, Any] = {}
        for key, value in raw.items():
            if key == "ignored" or key in IGNORED:
                ignored.append(key)
                continue
            if key in REPLACED:
                replaced[key] = value
                continue
            if key in REFUSED:
                raise ValueError(f"{key} cannot be set: {REFUSED[key]}")
            name = ALIASES.get(key, key)
            if name not in CATBOOST_PARAMS and name not in CONFIG_KEYS:
                raise ValueError(_unknown_key(key))
            if name in keys:
                raise ValueError(
                    f"{given_as[name]} and {key} are the same CatBoost parameter; give one"
                )
            keys[name] = value
            given_as[name] = key
        return {**keys, "ignored": ignored, "replaced": replaced}

    @field_validator("thread_count")
    @classmethod
    def _threads(cls, value: int | None) -> int | None:
        if value == 0:
            raise ValueError(
                "0 is not a number of threads: give at least 1, or -1 (or leave it out) "
                "for the job's whole share"
            )
        return value

    @field_validator("cat_features", mode="before")
    @classmethod
    def _columns(cls, value: Any) -> Any:
        if not isinstance(value, list):
            return value
        for item in value:
            if isinstance(item, bool) or not isinstance(item, int | str) or item == "":
                raise ValueError(
                    "each entry is a column index (0, 1, …) or a feature name, "
                    f"not {json.dumps(item)}"
                )
            if isinstance(item, int) and item < 0:
                raise ValueError(f"column indices start at 0, not {item}")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.feature_names is not None and len(set(self.feature_names)) != len(
            self.feature_names
        ):
            raise ValueError("feature_names: the names must be unique")
        if len(set(self.cat_features)) != len(self.cat_features):
            raise ValueError("cat_features: each feature may be listed once")
        if "onnx" in self.outputs and self.cat_features:
            raise ValueError(
                "outputs: CatBoost cannot export a model with categorical features "
                "(cat_features) to ONNX; drop onnx from outputs or train without cat_features"
            )
        self.outputs = list(dict.fromkeys(self.outputs))
        return self

    @property
    def seed(self) -> int:
        """The seed of the eval split: CatBoost's own default (0) when none is given."""
        return self.random_seed or 0

    def catboost_params(self, thread_share: int) -> dict[str, Any]:
        """The tenant's CatBoost keywords, with `thread_count` checked against the job's share."""
        params = self.model_dump(exclude=set(CONFIG_KEYS), exclude_none=True)
        params.update(self.model_extra or {})
        threads = params.pop("thread_count", -1)
        if threads > thread_share:
            raise JobFailure(
                FailureCode.INVALID_CONFIG,
                f"train config: thread_count {threads} is above this job's share of "
                f"{thread_share} CPU threads; lower it or leave it out to use the whole share",
            )
        params["thread_count"] = thread_share if threads == -1 else threads
        return params


def parse_train_config(data: bytes) -> TrainConfig:
    """Raises `JobFailure(INVALID_CONFIG)` with what to change."""
    head = data[:16].lstrip()
    if not head:
        raise _not_a_config("the file is empty")
    if head.startswith(b"PK"):
        raise _not_a_config(
            "it is a zip archive (an NPZ of inputs?); did you swap model_url and inputs_url?"
        )
    if head.startswith(b"CBM1"):
        raise _not_a_config("it is a trained CatBoost model (.cbm), not a train config")
    try:
        raw = json.loads(data)
    except RecursionError as exc:  # nested deeper than the parser goes
        raise _too_deep() from exc
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _not_a_config(f"it is not JSON ({exc})") from exc
    if _deeper_than(raw, MAX_DEPTH):
        raise _too_deep()
    if not isinstance(raw, dict):
        raise _not_a_config(
            f"it is a JSON {type(raw).__name__}, not an object such as "
            '{"task": "classification", "iterations": 500}'
        )
    try:
        return TrainConfig.model_validate(raw)
    except ValidationError as exc:
        raise JobFailure(
            FailureCode.INVALID_CONFIG, _clip(f"train config: {_problems(exc)}")
        ) from exc


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether lists and objects nest more than `limit` levels; without recursion, so a
    config can never exhaust the stack of what reads it next (pydantic, CatBoost)."""
    level: list[tuple[Any, int]] = [(value, 1)]
    while level:
        item, depth = level.pop()
        if isinstance(item, dict | list):
            if depth > limit:
                return True
            children = item.values() if isinstance(item, dict) else item
            level.extend((child, depth + 1) for child in children)
    return False


def _too_deep() -> JobFailure:
    return JobFailure(
        FailureCode.INVALID_CONFIG,
        f"train config: lists and objects nest more than {MAX_DEPTH} levels deep; CatBoost "
        'parameters are flat, e.g. {"task": "regression", "iterations": 500}',
    )


def _not_a_config(why: str) -> JobFailure:
    return JobFailure(
        FailureCode.INVALID_CONFIG,
        f"model_url did not point to a JSON train config: {why.rstrip('.')}"
        f"{'' if why.endswith('?') else '.'} A CatBoost job takes the "
        'train config as model_url (e.g. {"task": "regression", "iterations": 500}) and '
        "the NPZ of X and y as inputs_url",
    )


def _unknown_key(key: str) -> str:
    known = sorted(CATBOOST_PARAMS | set(ALIASES) | set(CONFIG_KEYS))
    close = difflib.get_close_matches(key, known, n=1)
    hint = f"; did you mean {close[0]}?" if close else ""
    return (
        f"unknown key {key!r}: it is neither a CatBoost training parameter nor one of "
        f"{', '.join(CONFIG_KEYS)}{hint}"
    )


def _problems(exc: ValidationError) -> str:
    problems = []
    for err in exc.errors():
        where = ".".join(str(part) for part in err["loc"])
        message = err["msg"].removeprefix("Value error, ")
        if where == "task" and err["type"] == "missing":
            message = 'the config must say which task: "classification", "regression" or "ranking"'
        elif where and err["type"] not in ("value_error", "missing"):
            message = f"{message} (got {json.dumps(err['input'], default=str)[:80]})"
        problems.append(f"{where}: {message}" if where else message)
    return "; ".join(problems)


def _clip(message: str) -> str:
    return message if len(message) <= MAX_MESSAGE_CHARS else message[:MAX_MESSAGE_CHARS] + "…"
