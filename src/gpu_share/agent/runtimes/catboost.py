"""The CatBoost train runtime (SPEC §1.6, §4.3):
`python -m gpu_share.agent.runtimes.catboost spec.json`.

`spec.model` is the JSON train config (`catboost_config`), `spec.inputs` the NPZ
of features and targets (`catboost_data`); both are checked before training, and
CatBoost is imported only once the config has passed its own checks. A
`catboost_cuda` job trains on the GPUs the sandbox made visible or fails: it is
never quietly trained on the CPU.

Progress: CatBoost prints every iteration into `TrainingLog`, which passes about
a hundred of those lines (and everything else CatBoost says) to stderr, where the
agent streams it to the tenant, and records which iterations this process ran.

Resuming (§4.3): CatBoost snapshots its progress every `snapshot_interval_sec`
to `options.snapshot_path` (written to a temporary file and renamed, so a killed
process leaves the previous snapshot whole). A requeued job's agent restores the
last snapshot and names it in `options.resume_from`; it is copied to the snapshot
path, and CatBoost continues from the iteration it holds. With the same data and
parameters the resumed model is the one an uninterrupted run would have made. A
snapshot CatBoost cannot use (corrupt: it ignores it; from different data: it
refuses it) means training from the start, which the log says.

Outputs (`catboost_report`): `out/outputs.npz` with `model_cbm` (always),
`model_onnx` and `model_json` (as `outputs` asks; the files' bytes as uint8),
`report_json` (UTF-8 JSON: task, device, effective params, iterations,
best_iteration, final train/eval metrics, learning curves, feature names and
importances) and `feature_importances`. CatBoost's own files (its train_dir)
stay in the job's `tmp/catboost`. A spot check's job (`options.evaluate`, set by the
agent for the coordinator's checks only) adds what it measured of another node's model
for the same job (`catboost_evaluation`).
"""

import json
import math
import os
import re
import shutil
import sys
import time
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gpu_share.agent.runtimes.catboost_config import (
    CATBOOST_PARAMS,
    TrainConfig,
    parse_train_config,
)
from gpu_share.agent.runtimes.catboost_data import Split, TrainingData, training_data
from gpu_share.agent.runtimes.catboost_report import catboost_message, training_outputs
from gpu_share.agent.runtimes.npz import Array, NpzError, NpzTooLarge, load_npz, save_npz
from gpu_share.agent.runtimes.runner import (
    FailureCode,
    JobFailure,
    Metrics,
    Result,
    Runtime,
    Spec,
    inputs_cap,
    log,
    memory_failure,
    memory_limit,
    peak_rss_bytes,
    run_runtime,
)

OUTPUTS_FILENAME = "outputs.npz"
SCRATCH_DIR = "tmp/catboost"  # CatBoost's train_dir: it writes snapshots only with one
LOG_LINES = 100  # progress lines per training, about
ESTIMATORS = {
    "classification": "CatBoostClassifier",
    "regression": "CatBoostRegressor",
    "ranking": "CatBoostRanker",
}

OUT_OF_MEMORY_SIGNS = ("out of memory", "bad_alloc", "cudaerrormemoryallocation", "not enough")
DATA_WORDS = ("target", "label", "feature", "group", "query", "weight", "pool", "object")
# A CatBoost error naming a parameter is about the config ("name" is too common a word).
PARAM_NAMES = re.compile(rf"\b({'|'.join(sorted(CATBOOST_PARAMS - {'name'}))})\b")


class TrainOptions(BaseModel):
    """`spec.options`, set by the agent."""

    model_config = ConfigDict(extra="forbid")

    snapshot_path: str = "checkpoint/snapshot.cbs"
    snapshot_interval_sec: int = Field(default=60, ge=1)
    resume_from: str | None = None
    # A spot check (docs/trust.md): another node's outputs for this job, to score as well.
    evaluate: str | None = None

    @field_validator("snapshot_path", "resume_from", "evaluate")
    @classmethod
    def _inside_job(cls, value: str | None) -> str | None:
        if value is not None:
            path = PurePosixPath(value)
            if not value or path.is_absolute() or ".." in path.parts:
                raise ValueError(f"{value!r} must be a path inside the job directory")
        return value


class TrainingLog:
    """CatBoost's output (a file-like `log_cout`/`log_cerr`), passed on to stderr.

    CatBoost prints every computed iteration here; one line in `every` goes on, plus
    the first and the last this process ran, so the log holds about `LOG_LINES`.
    """

    ITERATION = re.compile(r"^(\d+):\t")

    def __init__(self, every: int) -> None:
        self.every = every
        self.first: int | None = None
        self.last: int | None = None
        self._held: str | None = None  # the latest iteration line not passed on yet
        self._partial = ""

    def write(self, text: str) -> int:
        lines = (self._partial + text).split("\n")
        self._partial = lines.pop()
        for line in lines:
            self._line(line)
        return len(text)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        if self._partial:
            self._line(self._partial)
            self._partial = ""
        self._release()

    def _release(self) -> None:
        """Pass on the held line: the last iteration before CatBoost's summary, or of all."""
        if self._held is not None:
            self._emit(self._held)
            self._held = None

    def _line(self, line: str) -> None:
        match = self.ITERATION.match(line)
        if match is None:
            if line.strip():
                self._release()
                self._emit(line)
            return
        iteration = int(match[1])
        if self.first is None:
            self.first = iteration
            if iteration > 0:
                log(f"resuming from snapshot at iteration {iteration}")
        self.last = iteration
        if iteration == self.first or iteration % self.every == 0:
            self._emit(line)
            self._held = None
        else:
            self._held = line

    def _emit(self, line: str) -> None:
        sys.stderr.write(line.rstrip() + "\n")
        sys.stderr.flush()


def run_catboost(spec: Spec) -> Result:
    started = time.perf_counter()
    if spec.runtime not in (Runtime.CATBOOST_CPU, Runtime.CATBOOST_CUDA):
        raise JobFailure(
            FailureCode.INVALID_CONFIG, f"the catboost runtime cannot run {spec.runtime}"
        )
    options = _options(spec)
    threads = spec.threads or _cpu_share()
    config = _read_config(Path(spec.model))
    params = config.catboost_params(threads)
    for key in config.ignored:
        log(f"train config: {key} is ignored; the runtime logs progress about {LOG_LINES} times")

    import catboost  # only now: a config mistake is reported without loading CatBoost

    device, device_params = _device(spec)
    params.update(device_params)
    for key, value in config.replaced.items():
        log(
            f"train config: {key} {json.dumps(value)} is replaced by "
            f"{json.dumps(device_params.get(key))}: the runtime trains on the GPUs the job "
            "was given"
            if key in device_params
            else f"train config: {key} is ignored: a {spec.runtime.value} job trains on the CPU"
        )

    data = training_data(_read_inputs(spec), config)
    log(_describe_data(data))
    _check_params(getattr(catboost, ESTIMATORS[config.task]), params, config.task, data)
    train_pool = _pool(catboost, data.train, data, "X")
    eval_pool = None if data.eval is None else _pool(catboost, data.eval, data, "X_eval")

    snapshot, restored = _restore_snapshot(options)
    scratch = Path(SCRATCH_DIR).resolve()
    scratch.mkdir(parents=True, exist_ok=True)
    period = config.metric_period or 1
    every = max(period, math.ceil(config.iterations / LOG_LINES / period) * period)
    params.update(
        train_dir=str(scratch),
        allow_writing_files=True,  # CatBoost refuses snapshots without it
        save_snapshot=True,
        snapshot_file=str(snapshot.resolve()),
        snapshot_interval=options.snapshot_interval_sec,
        verbose=period,  # every computed iteration reaches TrainingLog, which thins them
    )
    load_ms = _ms_since(started)
    log(
        f"training: {config.task}, {config.iterations} iterations on {device} "
        f"({params.get('devices', f'{threads} threads')}), snapshot every "
        f"{options.snapshot_interval_sec} s to {options.snapshot_path}"
    )

    fit_started = time.perf_counter()
    model, progress, resumed = _fit(
        catboost, config, params, train_pool, eval_pool, every, restored
    )
    if snapshot.is_file():
        log(f"last snapshot: {snapshot.stat().st_size} bytes at {options.snapshot_path}")
    outputs, report = training_outputs(
        model,
        config,
        data,
        train_pool,
        first=progress.first,
        last=progress.last,
        from_snapshot=resumed,
        scratch=scratch,
    )
    if options.evaluate is not None:  # only a spot check's: the import is paid by it alone
        from gpu_share.agent.runtimes.catboost_evaluation import evaluated_outputs

        outputs.update(
            evaluated_outputs(
                Path(options.evaluate),
                config,
                data,
                (train_pool, eval_pool),
                catboost,
                memory_limit(spec),
            )
        )
    outputs_path = Path(spec.outputs_dir) / OUTPUTS_FILENAME
    outputs_path.parent.mkdir(parents=True, exist_ok=True)
    save_npz(outputs_path, outputs)
    compute_ms = _ms_since(fit_started)
    log(
        f"trained {report['iterations']} trees in {compute_ms} ms on {report['device']}; wrote "
        f"{outputs_path} ({outputs_path.stat().st_size} bytes: {', '.join(outputs)})"
    )
    return Result(
        ok=True,
        outputs=str(outputs_path),
        outputs_format="npz",
        metrics=Metrics(
            device=report["device"],
            load_ms=load_ms,
            compute_ms=compute_ms,
            peak_rss_bytes=peak_rss_bytes(),
            extra={
                "iterations": report["iterations"],
                "best_iteration": report["best_iteration"],
                "resumed": report["resumed"],
                "iterations_run_this_attempt": report["iterations_run_this_attempt"],
                "threads": params["thread_count"],
                "train_rows": data.train.rows,
                "eval_rows": 0 if data.eval is None else data.eval.rows,
                **({"gpus": len(params["devices"].split(":"))} if "devices" in params else {}),
            },
        ),
    )


# Before training


def _options(spec: Spec) -> TrainOptions:
    try:
        return TrainOptions.model_validate(spec.options)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()
        )
        raise JobFailure(
            FailureCode.INVALID_CONFIG, f"invalid options for the catboost runtime: {problems}"
        ) from exc


def _cpu_share() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _read_config(path: Path) -> TrainConfig:
    if not path.is_file():
        raise JobFailure(FailureCode.INVALID_CONFIG, f"the train config file {path} is missing")
    return parse_train_config(path.read_bytes())


def _read_inputs(spec: Spec) -> dict[str, Array]:
    inputs = spec.inputs
    if inputs is None:
        raise JobFailure(
            FailureCode.INVALID_INPUTS,
            "CatBoost training needs inputs_url: an NPZ holding X (or one array per feature) and y",
        )
    path = Path(inputs)
    if not path.is_file():
        raise JobFailure(FailureCode.INVALID_CONFIG, f"the inputs file {path} is missing")
    with path.open("rb") as file:
        head = file.read(64).lstrip()
    if head.startswith((b"{", b"[")):
        raise JobFailure(
            FailureCode.INVALID_INPUTS,
            "inputs_url did not point to an NPZ file: it is JSON (a train config?); did you "
            "swap model_url and inputs_url? inputs_url takes the NPZ of X and y, model_url "
            "the JSON train config",
        )
    try:
        return load_npz(path, max_bytes=memory_limit(spec), cap=inputs_cap(spec))
    except NpzTooLarge as exc:
        raise JobFailure(FailureCode.RESOURCE_LIMIT, f"inputs_url: {exc}") from exc
    except NpzError as exc:
        raise JobFailure(FailureCode.INVALID_INPUTS, f"inputs_url: {exc}") from exc


def _device(spec: Spec) -> tuple[str, dict[str, Any]]:
    if spec.runtime == Runtime.CATBOOST_CPU:
        return "cpu", {"task_type": "CPU"}
    from catboost.utils import get_gpu_device_count

    return "cuda", gpu_params(get_gpu_device_count(), os.environ.get("CUDA_VISIBLE_DEVICES"))


def gpu_params(seen: int, visible: str | None) -> dict[str, Any]:
    """CatBoost's device keywords for training on every GPU the sandbox made visible.

    `CUDA_VISIBLE_DEVICES` names the job's GPUs (by UUID); CUDA numbers them 0, 1, … in
    that order, so `devices` is "0:1:…" in the sandbox's numbering, one per GPU the job
    was given and CatBoost sees (`seen`).
    """
    assigned = seen if visible is None else len([d for d in visible.split(",") if d.strip()])
    if seen == 0 or assigned == 0:
        raise JobFailure(
            FailureCode.RUNTIME_ERROR,
            "CUDA is not available to CatBoost on this node (it sees no GPU"
            + (", and none is assigned to the job" if assigned == 0 else "")
            + "); run the job as catboost_cpu or on a node that offers catboost_cuda",
        )
    if seen < assigned:
        log(f"CatBoost sees {seen} of the {assigned} GPUs given to the job; training on those")
    count = min(seen, assigned)
    return {"task_type": "GPU", "devices": ":".join(str(i) for i in range(count))}


def _check_params(estimator: Any, params: dict[str, Any], task: str, data: TrainingData) -> None:
    """CatBoost's own check of the values, before the data is handed to CatBoost.

    It is what `fit` runs first, through CatBoost's private helpers; should they move
    in a later CatBoost, the same check simply happens in `fit`. The loss a classifier
    defaults to depends on the labels, as in `fit`.
    """
    from catboost import CatBoostError

    try:
        from catboost.core import _check_param_types, _check_train_params, _params_type_cast

        canonical = dict(estimator(**params)._get_canonized_params())
        if "loss_function" not in canonical:
            canonical["loss_function"] = _default_loss(task, data.train.label, canonical)
        _check_param_types(canonical)
        _check_train_params(_params_type_cast(canonical))
    except CatBoostError as exc:
        raise JobFailure(
            FailureCode.INVALID_CONFIG,
            f"CatBoost refused the train config: {catboost_message(exc)}",
        ) from exc
    except (ImportError, AttributeError, TypeError):
        return


def _default_loss(task: str, label: Array, params: dict[str, Any]) -> str:
    """The loss CatBoost picks when the config names none (catboost.core's rule)."""
    if task == "regression":
        return "RMSE"
    if task == "ranking":
        return "YetiRank"
    if label.ndim == 2:
        return "MultiLogloss"
    classes = len(params.get("class_names") or np.unique(label))
    return "MultiClass" if classes > 2 and "target_border" not in params else "Logloss"


def _describe_data(data: TrainingData) -> str:
    parts = [f"train {data.train.rows} rows × {data.width} features"]
    if data.cat_features:
        parts.append(f"categorical columns {data.cat_features}")
    if data.eval is not None:
        parts.append(f"eval {data.eval.rows} rows (from {data.eval_source})")
    if data.train.group_id is not None:
        parts.append(f"{len(np.unique(data.train.group_id))} groups")
    return "data: " + ", ".join(parts)


def _pool(catboost: Any, split: Split, data: TrainingData, name: str) -> Any:
    try:
        return catboost.Pool(
            split.features,
            label=split.label,
            cat_features=data.cat_features or None,
            group_id=split.group_id,
            weight=split.weight,
            feature_names=None if hasattr(split.features, "iloc") else data.feature_names,
        )
    except catboost.CatBoostError as exc:
        raise JobFailure(
            FailureCode.INVALID_INPUTS, f"CatBoost could not read {name}: {catboost_message(exc)}"
        ) from exc


def _restore_snapshot(options: TrainOptions) -> tuple[Path, bool]:
    snapshot = Path(options.snapshot_path)
    snapshot.parent.mkdir(parents=True, exist_ok=True)
    if options.resume_from is None:
        return snapshot, snapshot.is_file()
    source = Path(options.resume_from)
    if not source.is_file():
        log(f"resume_from {source} is missing; training from the start")
        return snapshot, snapshot.is_file()
    if source.resolve() != snapshot.resolve():
        shutil.copyfile(source, snapshot)
    log(f"restored the previous attempt's snapshot ({snapshot.stat().st_size} bytes)")
    return snapshot, True


# Training


def _fit(
    catboost: Any,
    config: TrainConfig,
    params: dict[str, Any],
    train_pool: Any,
    eval_pool: Any,
    every: int,
    restored: bool,
) -> tuple[Any, TrainingLog, bool]:
    """The trained model, what it printed, and whether it went on from the snapshot."""
    estimator = getattr(catboost, ESTIMATORS[config.task])
    for attempt in ("snapshot", "fresh") if restored else ("fresh",):
        progress = TrainingLog(every)
        model = estimator(**params)
        try:
            model.fit(train_pool, eval_set=eval_pool, log_cout=progress, log_cerr=progress)
        except catboost.CatBoostError as exc:
            progress.close()
            message = catboost_message(exc)
            if attempt == "snapshot" and "snapshot" in message and progress.first is None:
                log(f"the snapshot cannot be used ({message}); training from the start")
                Path(params["snapshot_file"]).unlink(missing_ok=True)
                continue
            raise _training_failure(message, started=progress.first is not None) from exc
        progress.close()
        return model, progress, attempt == "snapshot"
    raise AssertionError("unreachable")


def _training_failure(message: str, *, started: bool) -> JobFailure:
    lowered = message.lower()
    if any(sign in lowered for sign in OUT_OF_MEMORY_SIGNS):
        detail = (
            f"CatBoost ran out of memory: {message}; use less data, a smaller depth or "
            "border_count, or a node with more memory"
        )
        if "cuda" in lowered:  # the GPU's memory, not the job's limit
            return JobFailure(FailureCode.OUT_OF_MEMORY, detail)
        return memory_failure(detail)
    if not started and PARAM_NAMES.search(message):
        return JobFailure(FailureCode.INVALID_CONFIG, f"CatBoost refused the config: {message}")
    if not started and any(word in lowered for word in DATA_WORDS):
        return JobFailure(FailureCode.INVALID_INPUTS, f"CatBoost refused the data: {message}")
    if not started:
        return JobFailure(FailureCode.INVALID_CONFIG, f"CatBoost refused the training: {message}")
    return JobFailure(FailureCode.RUNTIME_ERROR, f"CatBoost failed while training: {message}")


def _ms_since(started: float) -> int:
    return round((time.perf_counter() - started) * 1000)


def main(argv: list[str] | None = None) -> int:
    return run_runtime(run_catboost, sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
