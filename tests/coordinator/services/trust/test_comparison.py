"""How results are compared (docs/trust.md, "How results are compared"): pure functions, no
database. An honest difference (float noise of other hardware, an argmax flipped on a
near-tie, a dynamic length) is never a mismatch; a made-up result always is."""

import json
import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from gpu_share.coordinator.services.trust.comparison import (
    DEFAULT_TOLERANCES,
    Outcome,
    compare_outputs,
)
from gpu_share.coordinator.services.trust.failure_comparison import (
    FailureFacts,
    Margins,
    compare_failure,
)
from gpu_share.coordinator.services.trust.training_comparison import compare_training
from gpu_share.npz_reading import Array
from gpu_share.testing.rogue_agents import catboost_arrays, score_returned
from gpu_share.testing.simulated_agent import npz_bytes

TOL = DEFAULT_TOLERANCES


def ulps(array: Array, steps: int, rng: np.random.Generator) -> Array:
    """`array` moved by up to `steps` units in the last place, each element its own way."""
    out = array.copy()
    flat = out.reshape(-1)
    for _ in range(steps):
        direction = np.where(rng.random(flat.shape) < 0.5, -np.inf, np.inf).astype(array.dtype)
        flat[:] = np.nextafter(flat, direction)
    return out


@settings(max_examples=200, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    shape=st.sampled_from([(1,), (3,), (8, 10), (2, 3, 4), (1000,)]),
    dtype=st.sampled_from([np.float16, np.float32, np.float64]),
    steps=st.integers(0, 8),
    scale=st.sampled_from([1e-6, 1e-3, 1.0, 1e3, 1e6]),
)
def test_float_noise_of_a_few_ulps_is_never_a_mismatch(
    seed: int, shape: tuple[int, ...], dtype: type, steps: int, scale: float
) -> None:
    rng = np.random.default_rng(seed)
    with np.errstate(over="ignore"):
        trusted: Array = (rng.standard_normal(shape) * scale).astype(dtype)
        node = ulps(trusted, steps, rng)
    assume(np.isfinite(node).all() and np.isfinite(trusted).all())  # float16 holds no 1e6
    verdict = compare_outputs({"y": node}, {"y": trusted}, TOL)
    assert verdict.outcome is Outcome.MATCH, verdict


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), depth=st.integers(1, 64))
def test_tf32_like_accumulation_noise_in_a_deep_chain_is_never_a_mismatch(
    seed: int, depth: int
) -> None:
    """Each layer rounds its inputs to 10 bits of mantissa (TF32) on one machine and not on
    the other: what Ampere GPUs do to float32 matrix products, compounded."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((4, 64)).astype(np.float32)
    exact, rounded = x.copy(), x.copy()
    for _ in range(depth):
        w = (rng.standard_normal((64, 64)) / 8).astype(np.float32)
        exact = np.tanh(exact @ w)
        mantissa = np.frexp(rounded)
        rounded = np.ldexp(np.round(mantissa[0] * 2**11) / 2**11, mantissa[1]).astype(np.float32)
        rounded = np.tanh(rounded @ w)
    verdict = compare_outputs({"y": rounded}, {"y": exact}, TOL)
    assert verdict.outcome is Outcome.MATCH, verdict


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), shape=st.sampled_from([(4, 10), (1000,)]))
def test_made_up_floats_of_the_right_shape_are_a_mismatch(
    seed: int, shape: tuple[int, ...]
) -> None:
    rng = np.random.default_rng(seed)
    trusted = rng.standard_normal(shape).astype(np.float32)
    fake = rng.standard_normal(shape).astype(np.float32)
    verdict = compare_outputs({"y": fake}, {"y": trusted}, TOL)
    assert verdict.outcome is Outcome.MISMATCH, verdict


def test_a_made_up_scalar_rarely_lands_within_the_tolerance() -> None:
    """One number guessed is caught unless the guess is within 2 % of the truth: a cheat
    faking scalars gets past one check in some tens, never a run of them."""
    rng = np.random.default_rng(5)
    outcomes = [
        compare_outputs(
            {"y": rng.standard_normal(1).astype(np.float32)},
            {"y": rng.standard_normal(1).astype(np.float32)},
            TOL,
        ).outcome
        for _ in range(2000)
    ]
    assert outcomes.count(Outcome.MISMATCH) / len(outcomes) > 0.97


def test_an_argmax_flipped_on_a_near_tie_is_not_a_mismatch_but_made_up_labels_are() -> None:
    rng = np.random.default_rng(3)
    labels = rng.integers(0, 10, 500)
    flipped = labels.copy()
    flipped[[7, 300]] = (flipped[[7, 300]] + 1) % 10
    assert compare_outputs({"l": flipped}, {"l": labels}, TOL).outcome is Outcome.MATCH
    one = compare_outputs({"l": np.array([3])}, {"l": np.array([4])}, TOL)
    assert one.outcome is Outcome.INCONCLUSIVE  # one label tells nothing either way
    fake = rng.integers(0, 10, 500)
    assert compare_outputs({"l": fake}, {"l": labels}, TOL).outcome is Outcome.MISMATCH


def test_names_dtypes_and_shapes_must_agree_but_a_dynamic_length_is_inconclusive() -> None:
    a = np.zeros((5, 4), np.float32)
    assert compare_outputs({"x": a}, {"y": a}, TOL).outcome is Outcome.MISMATCH
    assert compare_outputs({"x": a.astype(np.float64)}, {"x": a}, TOL).outcome is Outcome.MISMATCH
    assert compare_outputs({"x": a.reshape(20)}, {"x": a}, TOL).outcome is Outcome.MISMATCH
    boxes = np.zeros((6, 4), np.float32)  # one detection more past a threshold
    assert compare_outputs({"x": boxes}, {"x": a}, TOL).outcome is Outcome.INCONCLUSIVE
    assert compare_outputs({"x": np.zeros((50, 4))}, {"x": a}, TOL).outcome is Outcome.MISMATCH


def test_nan_and_infinities_agree_only_with_themselves() -> None:
    trusted = np.array([np.nan, np.inf, -np.inf, 1.0] * 50, np.float32)
    assert compare_outputs({"x": trusted.copy()}, {"x": trusted}, TOL).outcome is Outcome.MATCH
    nan_everywhere = np.full_like(trusted, np.nan)
    assert compare_outputs({"x": nan_everywhere}, {"x": trusted}, TOL).outcome is Outcome.MISMATCH


def test_the_evidence_names_each_array_and_how_far_apart_they_were() -> None:
    trusted = np.arange(10, dtype=np.float32)
    verdict = compare_outputs({"y": trusted + 5}, {"y": trusted}, TOL)
    entry = verdict.details["arrays"]["y"]
    assert entry["outcome"] == "mismatch" and entry["max_abs_diff"] == 5.0
    assert entry["node"]["head"][:2] == [5.0, 6.0] and entry["trusted"]["shape"] == [10]
    json.dumps(verdict.details)  # stored as JSON evidence


def _training(seed: int, **report: object) -> dict[str, Array]:
    arrays = catboost_arrays(seed)
    if report:
        parsed = json.loads(arrays["report_json"].tobytes())
        parsed.update(report)
        arrays["report_json"] = np.frombuffer(json.dumps(parsed).encode(), np.uint8)
    return arrays


def _scored(node: dict[str, Array]) -> dict[str, Array]:
    evaluation = score_returned(npz_bytes(**node))
    return {"evaluation_json": np.frombuffer(json.dumps(evaluation).encode(), np.uint8)}


def test_a_training_is_judged_by_scoring_the_model_it_returned() -> None:
    honest = _training(11)
    assert compare_training(honest, _scored(honest), TOL).outcome is Outcome.MATCH
    flattering = catboost_arrays(11, reported_score=0.01)
    verdict = compare_training(flattering, _scored(flattering), TOL)
    assert verdict.outcome is Outcome.MISMATCH and "RMSE" in verdict.reason
    fewer = _training(11, iterations=3)
    assert compare_training(fewer, _scored(fewer), TOL).outcome is Outcome.MISMATCH
    no_model = {"report_json": honest["report_json"]}
    assert compare_training(no_model, _scored(honest), TOL).outcome is Outcome.MISMATCH
    assert compare_training("not an NPZ", _scored(honest), TOL).outcome is Outcome.MISMATCH
    assert compare_training(honest, {}, TOL).outcome is Outcome.INCONCLUSIVE  # an old agent


def test_a_model_the_trusted_catboost_cannot_load_is_inconclusive() -> None:
    unloadable = {"model": "unloadable", "problem": "written by a newer CatBoost"}
    evaluation = {"evaluation_json": np.frombuffer(json.dumps(unloadable).encode(), np.uint8)}
    assert compare_training(_training(2), evaluation, TOL).outcome is Outcome.INCONCLUSIVE


FACTS = FailureFacts(
    timeout_sec=600,
    check_ms=1000,
    check_peak_bytes=1 << 30,
    node_memory_bytes=80 << 30,
    speedup=1.0,
)


@pytest.mark.parametrize(
    ("code", "facts", "outcome"),
    [
        ("RUNTIME_ERROR", FACTS, Outcome.MISMATCH),
        ("OUT_OF_MEMORY", FACTS, Outcome.MISMATCH),
        # the trusted node needed most of what the node had: it could have run out honestly
        ("OUT_OF_MEMORY", FailureFacts(600, 1000, 60 << 30, 80 << 30, 1.0), Outcome.INCONCLUSIVE),
        ("OUT_OF_MEMORY", FailureFacts(600, 1000, None, 80 << 30, 1.0), Outcome.INCONCLUSIVE),
        ("TIMEOUT", FACTS, Outcome.MISMATCH),
        # ten times faster, it took a quarter of the timeout: the node may just be slow
        ("TIMEOUT", FailureFacts(600, 150_000, None, None, 10.0), Outcome.INCONCLUSIVE),
        ("TIMEOUT", FailureFacts(600, 1000, None, None, None), Outcome.INCONCLUSIVE),
    ],
)
def test_a_failure_the_trusted_node_did_not_have_counts_only_when_it_cannot_be_honest(
    code: str, facts: FailureFacts, outcome: Outcome
) -> None:
    assert compare_failure(code, True, None, facts, Margins()).outcome is outcome


def test_a_failure_reproduced_is_a_match_and_a_check_that_never_ran_tells_nothing() -> None:
    assert compare_failure("RUNTIME_ERROR", False, "RUNTIME_ERROR", FACTS, Margins()).outcome is (
        Outcome.MATCH
    )
    assert compare_failure("OUT_OF_MEMORY", False, "INVALID_MODEL", FACTS, Margins()).outcome is (
        Outcome.MATCH
    )
    for code in ("NO_CAPACITY", "LEASE_EXPIRED", "ARTIFACT_EXPIRED", "DOWNLOAD_FAILED"):
        verdict = compare_failure("RUNTIME_ERROR", False, code, FACTS, Margins())
        assert verdict.outcome is Outcome.INCONCLUSIVE
    assert math.isfinite(FACTS.timeout_sec)
