"""RFC 7240 `Prefer`: only `wait` is read; anything else is ignored, a bad wait is a 422."""

import pytest

from gpu_share.coordinator.api.prefer import wait_preference
from gpu_share.coordinator.core.errors import ValidationFailed


@pytest.mark.parametrize(
    ("headers", "wanted"),
    [
        (None, None),
        ([], None),
        (["respond-async"], None),
        (["return=minimal, handling=lenient"], None),
        (["wait=10"], 10),
        (["WAIT = 7"], 7),
        (["respond-async, wait=10"], 10),
        (['wait="12"'], 12),
        (["wait=5; unknown=param"], 5),
        (['foo="a,b", wait=3'], 3),
        (["wait=0"], 0),
        (["wait"], 60),
        (["wait=4, wait=9"], 4),  # of a preference named twice only the first counts
        (["return=minimal", "wait=8"], 8),  # several header lines
    ],
)
def test_the_wait_asked_for(headers: list[str] | None, wanted: int | None) -> None:
    assert wait_preference(headers, 60) == wanted


@pytest.mark.parametrize("value", ["wait=abc", "wait=61", "wait=-1", "wait=1.5", 'wait="x"', "=5"])
def test_a_wait_that_cannot_be_honoured_says_what_to_send(value: str) -> None:
    with pytest.raises(ValidationFailed) as raised:
        wait_preference([value], 60)
    assert "Prefer: wait=10" in raised.value.message
