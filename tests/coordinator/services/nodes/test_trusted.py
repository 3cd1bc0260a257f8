"""Which nodes take other nodes' spot checks (docs/trust.md, "Spot checks"): the admin's
mark, or the record of a verified Enterprise node; never a quarantined one."""

from datetime import UTC, datetime

import pytest

from gpu_share.coordinator.core.orm import NodeRow
from gpu_share.coordinator.services.nodes.trusted import TrustRule, is_trusted, record_of
from gpu_share.testing.verification import proofs_for

RULE = TrustRule(min_clean_checks=200, min_reliability=0.95)
NOW = datetime(2026, 12, 1, tzinfo=UTC)


def enterprise_node(matched: int = 250, mismatched: int = 0, score: float = 0.97) -> NodeRow:
    node = NodeRow(
        id="nod_test",
        tier="enterprise",
        gpus=[],
        cpu_count=8,
        trusted=False,
        reliability={"score": score},
        spot_checks={"rate": 0.03, "matched": matched, "mismatched": mismatched},
    )
    node.verification = proofs_for(node, NOW)
    return node


def test_a_verified_enterprise_node_with_a_long_clean_record_is_trusted() -> None:
    assert is_trusted(enterprise_node(), RULE)


@pytest.mark.parametrize(
    "change",
    [
        {"tier": "community"},
        {"verification": None},
        {"reliability": {"score": 0.9}},
        {"spot_checks": {"matched": 199, "mismatched": 0}},
        {"spot_checks": {"matched": 900, "mismatched": 1}},
        {"quarantined_at": NOW},
    ],
)
def test_anything_short_of_the_whole_rule_is_not(change: dict[str, object]) -> None:
    node = enterprise_node()
    for key, value in change.items():
        setattr(node, key, value)
    assert not is_trusted(node, RULE)


def test_the_admins_mark_trusts_any_node_but_a_quarantined_one() -> None:
    node = NodeRow(id="nod_test", tier="community", gpus=[], trusted=True)
    assert is_trusted(node, RULE)
    node.quarantined_at = NOW
    assert not is_trusted(node, RULE)


def test_a_record_not_in_the_expected_shape_reads_as_empty() -> None:
    node = NodeRow(id="nod_test", spot_checks={"runtimes": {"onnx_cpu": "junk", "x": {"rate": 7}}})
    record = record_of(node, 0.5)
    assert list(record.runtimes) == ["x"] and record.runtimes["x"].rate == 0.5
