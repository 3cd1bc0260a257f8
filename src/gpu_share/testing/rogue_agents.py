"""How simulated agents answer jobs, honestly or not, for the spot-check tests
(docs/trust.md): each is a `Behaviour` for `SimulatedAgent`, turning a leased job into
the report a real agent would send.

An honest answer is a function of the job alone (its runtime, model and inputs, as
their checksums name them), so any two honest nodes agree on it, up to the noise real
hardware adds (`Honest(noise=…)`: a few float32 ulps). CatBoost is simulated the same
way: the "model" a training returns names the job it was trained for, its true scores
follow from that, and a check's job (`LeasedJob.evaluate`) scores the model it is given
as the real runtime would (`evaluation_json`).

The cheats: `FakeOutputs` (plausible arrays of the right names, shapes and dtypes,
never computed), `FakeShare` (fakes a share of the jobs), `FakeFailures` (reports a
failure after a few seconds without running anything), `HonestThenFake` (builds a
record, then fakes).
"""

import base64
import hashlib
import json
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gpu_share.agent.client import CoordinatorClient
from gpu_share.npz_reading import Array, load_npz_bytes
from gpu_share.protocol import agent as wire
from gpu_share.protocol.errors import ErrorCode
from gpu_share.protocol.invokes import InvokeError, InvokeResult, InvokeStatus, Metrics
from gpu_share.testing.simulated_agent import npz_bytes

TREES = 20
DURATION_MS = 1000


def job_seed(job: wire.LeasedJob) -> int:
    """What the job is: the same for every node that runs it."""
    parts = [job.runtime.value]
    for ref in (job.model, job.inputs):
        parts.append("" if ref is None else (ref.sha256 or ref.url.split("?", 1)[0]))
    return int.from_bytes(hashlib.sha256("|".join(parts).encode()).digest()[:8], "big")


def _json(value: object) -> Array:
    return np.frombuffer(json.dumps(value).encode(), dtype=np.uint8)


def onnx_arrays(seed: int) -> dict[str, Array]:
    rng = np.random.default_rng(seed)
    logits = rng.standard_normal((8, 10)).astype(np.float32)
    return {"logits": logits, "label": logits.argmax(axis=1).astype(np.int64)}


def true_score(model_seed: int) -> float:
    """The eval RMSE the simulated model of `model_seed` really has."""
    return 0.1 + (model_seed % 1000) / 10_000


def importances(model_seed: int) -> list[float]:
    rng = np.random.default_rng(model_seed)
    values = rng.random(4)
    return [float(v) for v in values / values.sum() * 100]


def catboost_arrays(model_seed: int, *, reported_score: float | None = None) -> dict[str, Array]:
    """A training's outputs: the model (naming its seed) and its report."""
    score = true_score(model_seed) if reported_score is None else reported_score
    report = {
        "task": "regression",
        "iterations": TREES,
        "metrics": {"train": {"RMSE": score / 2}, "eval": {"RMSE": score}},
        "feature_importances": importances(model_seed),
    }
    return {
        "model_cbm": np.frombuffer(b"CBM1" + model_seed.to_bytes(8, "big"), dtype=np.uint8),
        "report_json": _json(report),
        "feature_importances": np.asarray(importances(model_seed), dtype=np.float64),
    }


def score_returned(outputs: bytes) -> dict[str, object]:
    """What the real runtime's scoring (`catboost_evaluation`) would measure."""
    try:
        arrays = load_npz_bytes(outputs)
    except ValueError as exc:
        return {"model": "missing", "problem": str(exc)}
    blob = arrays.get("model_cbm")
    if blob is None:
        return {"model": "missing", "problem": "no model_cbm"}
    raw = blob.tobytes()
    if not raw.startswith(b"CBM1") or len(raw) != 12:
        return {"model": "not_catboost", "problem": "not a CatBoost model file"}
    model_seed = int.from_bytes(raw[4:], "big")
    return {
        "model": "loaded",
        "trees": TREES,
        "expected_trees": None,
        "params_differing": {},
        "feature_importances": importances(model_seed),
        "metrics": {"eval": {"RMSE": true_score(model_seed)}},
    }


async def _evaluated(job: wire.LeasedJob, client: CoordinatorClient | None) -> bytes:
    """The outputs a check is to score, as the real agent gets them (`agent/evaluated`)."""
    ref = job.evaluate
    assert ref is not None
    if ref.inline_base64 is not None:
        return base64.b64decode(ref.inline_base64)
    assert ref.artifact is not None and client is not None, "a stored one needs a client"
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "evaluated.npz"
        await client.download(ref.artifact.url, path, max_bytes=1 << 30, timeout=60)
        return path.read_bytes()


def report(
    job: wire.LeasedJob, arrays: Mapping[str, Array], device: str = "cpu"
) -> wire.ResultReport:
    outputs = npz_bytes(**arrays)
    return wire.ResultReport(
        lease_token=job.lease_token,
        status=InvokeStatus.DONE,
        result=InvokeResult(
            outputs_format="npz",
            outputs_size=len(outputs),
            outputs_sha256=hashlib.sha256(outputs).hexdigest(),
            outputs_inline_base64=base64.b64encode(outputs).decode(),
            metrics=Metrics(device=device, duration_ms=DURATION_MS),
        ),
    )


def failure(job: wire.LeasedJob, code: ErrorCode, after_ms: int) -> wire.ResultReport:
    return wire.ResultReport(
        lease_token=job.lease_token,
        status=InvokeStatus.TIMEOUT if code is ErrorCode.TIMEOUT else InvokeStatus.FAILED,
        result=InvokeResult(metrics=Metrics(device="cpu", duration_ms=after_ms)),
        error=InvokeError(code=code.value, message="the runtime failed"),
    )


@dataclass
class Honest:
    """Computes every job; `noise`: relative float32 noise, as other hardware adds;
    `stores_with`: outputs go to platform storage through this client, not inline."""

    noise: float = 0.0
    seed: int = 0
    stores_with: CoordinatorClient | None = None
    _rng: np.random.Generator = field(init=False)

    def __post_init__(self) -> None:
        self._rng = np.random.default_rng(self.seed)

    async def arrays(self, job: wire.LeasedJob) -> dict[str, Array]:
        seed = job_seed(job)
        if job.runtime.kind == "train":
            arrays = catboost_arrays(seed)
            if job.evaluate is not None:
                returned = await _evaluated(job, self.stores_with)
                arrays["evaluation_json"] = _json(score_returned(returned))
            return arrays
        arrays = onnx_arrays(seed)
        if self.noise:
            rng = np.random.default_rng(int(self._rng.integers(0, 2**32)))
            logits = arrays["logits"].astype(np.float32)
            jitter = rng.uniform(-self.noise, self.noise, logits.shape).astype(np.float32)
            noisy = (logits * (1 + jitter)).astype(np.float32)
            # the labels follow this node's own logits, as an argmax in the graph would
            arrays["logits"], arrays["label"] = noisy, noisy.argmax(axis=1).astype(np.int64)
        return arrays

    async def __call__(self, job: wire.LeasedJob) -> wire.ResultReport:
        arrays = await self.arrays(job)
        if self.stores_with is None:
            return report(job, arrays)
        return await stored_report(self.stores_with, job, arrays)


async def stored_report(
    client: CoordinatorClient, job: wire.LeasedJob, arrays: Mapping[str, Array]
) -> wire.ResultReport:
    """As a real agent reports outputs over the inline limit: stored, then named by URL."""
    outputs = npz_bytes(**arrays)
    sha = hashlib.sha256(outputs).hexdigest()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "outputs.npz"
        path.write_bytes(outputs)
        stored = await client.store_outputs(job.invoke_id, job.lease_token, path, sha)
    return wire.ResultReport(
        lease_token=job.lease_token,
        status=InvokeStatus.DONE,
        result=InvokeResult(
            outputs_format="npz",
            outputs_size=len(outputs),
            outputs_sha256=sha,
            outputs_url=stored.url,
            metrics=Metrics(device="cpu", duration_ms=DURATION_MS),
        ),
    )


@dataclass
class FakeOutputs:
    """Never runs anything: arrays of the right names, shapes and dtypes, made up."""

    seed: int = 1
    _rng: np.random.Generator = field(init=False)

    def __post_init__(self) -> None:
        self._rng = np.random.default_rng(self.seed)

    def arrays(self, job: wire.LeasedJob) -> dict[str, Array]:
        made_up = int(self._rng.integers(0, 2**48))
        if job.runtime.kind == "train":  # a model of nothing, with a flattering report
            return catboost_arrays(made_up, reported_score=0.01)
        return onnx_arrays(made_up)

    async def __call__(self, job: wire.LeasedJob) -> wire.ResultReport:
        return report(job, self.arrays(job))


@dataclass
class FakeShare:
    """Fakes `share` of the jobs (drawn per job), computes the rest."""

    share: float = 0.1
    seed: int = 2
    faked: int = 0
    _rng: np.random.Generator = field(init=False)
    _fake: FakeOutputs = field(init=False)
    _honest: Honest = field(init=False)

    def __post_init__(self) -> None:
        self._rng = np.random.default_rng(self.seed)
        self._fake = FakeOutputs(self.seed)
        self._honest = Honest()

    async def __call__(self, job: wire.LeasedJob) -> wire.ResultReport:
        if float(self._rng.random()) < self.share:
            self.faked += 1
            return await self._fake(job)
        return await self._honest(job)


@dataclass
class FakeFailures:
    """Reports `code` after `after_ms` without running the job."""

    code: ErrorCode = ErrorCode.RUNTIME_ERROR
    after_ms: int = 2000

    async def __call__(self, job: wire.LeasedJob) -> wire.ResultReport:
        return failure(job, self.code, self.after_ms)


@dataclass
class HonestThenFake:
    """Computes its first `honest_jobs` jobs, then fakes every one."""

    honest_jobs: int = 10
    answered: int = 0
    _fake: FakeOutputs = field(default_factory=FakeOutputs)
    _honest: Honest = field(default_factory=Honest)

    async def __call__(self, job: wire.LeasedJob) -> wire.ResultReport:
        self.answered += 1
        if self.answered <= self.honest_jobs:
            return await self._honest(job)
        return await self._fake(job)
