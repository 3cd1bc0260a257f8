"""The spot-check rate (docs/trust.md, "Spot checks"): BOINC's adaptive replication per
node and runtime, pure. It falls with every run of matches to a floor that still catches
a node turning to cheating, resets on a mismatch, ignores inconclusive checks, and
counts each runtime apart."""

from gpu_share.coordinator.core.orm import NodeRow
from gpu_share.coordinator.services.trust.comparison import Outcome
from gpu_share.coordinator.services.trust.spot_check_rates import (
    RatePolicy,
    current_rate,
    record_decision,
    record_outcome,
)

POLICY = RatePolicy(start=0.5, floor=0.03, halving=10)


def test_the_rate_halves_every_ten_matches_down_to_the_floor() -> None:
    assert [POLICY.rate(n) for n in (0, 9, 10, 19, 20, 30, 40)] == [
        0.5,
        0.5,
        0.25,
        0.25,
        0.125,
        0.0625,
        0.03125,
    ]
    assert POLICY.rate(50) == POLICY.rate(10_000) == 0.03


def test_a_floor_of_three_percent_catches_a_late_cheat_within_200_jobs_nearly_always() -> None:
    assert 1 - (1 - POLICY.floor) ** 200 > 0.99
    assert 1 - (1 - POLICY.start) ** 7 > 0.99  # a cheat from the start: within 7 jobs


def test_matches_lower_the_nodes_rate_and_a_mismatch_sets_it_back() -> None:
    node = NodeRow(id="nod_test")
    assert current_rate(node, "onnx_cuda", POLICY) == 0.5  # never checked: the start
    for _ in range(25):
        record_decision(node, "onnx_cuda", True, POLICY)
        record_outcome(node, "onnx_cuda", Outcome.MATCH, POLICY)
    assert current_rate(node, "onnx_cuda", POLICY) == 0.125
    assert node.spot_checks is not None and node.spot_checks["rate"] == 0.125
    record_outcome(node, "onnx_cuda", Outcome.INCONCLUSIVE, POLICY)
    assert current_rate(node, "onnx_cuda", POLICY) == 0.125  # told nothing: changes nothing
    record_outcome(node, "onnx_cuda", Outcome.MISMATCH, POLICY)
    assert current_rate(node, "onnx_cuda", POLICY) == 0.5
    entry = node.spot_checks["runtimes"]["onnx_cuda"]
    assert (entry["matched"], entry["mismatched"], entry["inconclusive"]) == (25, 1, 1)
    assert (entry["decided"], entry["checked"], entry["streak"]) == (25, 25, 0)
    assert node.spot_checks["matched"] == 25 and node.spot_checks["mismatched"] == 1


def test_each_runtime_keeps_its_own_rate_and_tenants_see_the_busiest() -> None:
    node = NodeRow(id="nod_test")
    for _ in range(30):
        record_decision(node, "onnx_cpu", True, POLICY)
        record_outcome(node, "onnx_cpu", Outcome.MATCH, POLICY)
    record_decision(node, "onnx_cuda", False, POLICY)
    assert current_rate(node, "onnx_cpu", POLICY) == 0.0625
    assert current_rate(node, "onnx_cuda", POLICY) == 0.5  # honest on the CPU says nothing
    assert node.spot_checks is not None and node.spot_checks["rate"] == 0.0625


def test_a_change_of_the_settings_applies_to_every_record_at_once() -> None:
    node = NodeRow(id="nod_test")
    for _ in range(60):
        record_outcome(node, "onnx_cuda", Outcome.MATCH, POLICY)
    assert current_rate(node, "onnx_cuda", RatePolicy(start=1.0, floor=1.0, halving=10)) == 1.0
