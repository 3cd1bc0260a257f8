"""Challenges are sized to the claim: the state fills the share of memory asked, the chain
takes the target time at the claimed rate, and what travels stays within the bounds."""

import pytest

from gpu_share.challenge import sizing
from gpu_share.protocol import trust

H100_RATE, H100_VRAM = 989.4e12, 81559 * 2**20


def size(kind: sizing.Kind, rate: float, memory: float, scale: float = 1.0) -> sizing.Shape:
    return sizing.size(
        kind,
        rate_flops=rate,
        memory_bytes=memory,
        target_sec=4.0,
        memory_share=0.15,
        samples=6,
        scale=scale,
    )


def test_an_h100_challenge_fills_its_share_of_vram_and_takes_the_target_at_its_rate() -> None:
    shape = size(sizing.Kind.GPU, H100_RATE, H100_VRAM)
    assert shape.width == sizing.MAX_WIDTH
    assert shape.state_bytes == pytest.approx(0.15 * H100_VRAM, rel=0.01)
    assert shape.flops / H100_RATE == pytest.approx(4.0, rel=0.01)
    assert shape.sketch_count <= sizing.MAX_SKETCHES
    assert shape.reveal_bytes(6) <= sizing.MAX_REVEAL_BYTES
    assert shape.problems(6) == []


def test_a_cpu_challenge_is_sized_by_its_cores_when_memory_would_take_longer() -> None:
    shape = size(sizing.Kind.CPU, 16 * 64e9, 64 * 2**30)
    assert shape.width == 1024 and shape.steps == sizing.MIN_STEPS
    assert shape.flops / (16 * 64e9) == pytest.approx(4.0, rel=0.02)
    assert shape.state_bytes < 0.15 * 64 * 2**30


def test_a_small_scale_narrows_the_rows_but_keeps_a_valid_chain() -> None:
    shape = size(sizing.Kind.GPU, H100_RATE, H100_VRAM, scale=1e-8)
    assert shape.width < sizing.MAX_WIDTH and shape.chunks >= 2
    assert shape.problems(6) == []


def test_a_shape_no_sizing_makes_is_named_as_such() -> None:
    wide = sizing.Shape(sizing.Kind.GPU, width=4096, rows=64, steps=8, sketch_rows=8)
    one_chunk = sizing.Shape(sizing.Kind.GPU, width=64, rows=8, steps=8, sketch_rows=8)
    assert any("width" in p for p in wide.problems(6))
    assert any("two chunks" in p for p in one_chunk.problems(6))


def test_the_wire_bounds_hold_every_challenge_sizing_makes() -> None:
    assert trust.MAX_WIDTH == sizing.MAX_WIDTH and trust.MAX_ROWS == sizing.MAX_ROWS
    assert trust.MAX_STEPS == sizing.MAX_STEPS and trust.MAX_SAMPLES == sizing.MAX_SAMPLES
    assert trust.MAX_SKETCH_ROWS == sizing.MAX_SKETCH_ROWS
    assert trust.MAX_SKETCHES == sizing.MAX_SKETCHES
    assert trust.MAX_REVEAL_BYTES == sizing.MAX_REVEAL_BYTES
    biggest_answer = (4 * sizing.MAX_REVEAL_BYTES) // 3 + 64 * 1024
    assert biggest_answer <= trust.MAX_ANSWER_BODY_BYTES
    assert (4 * 4 * sizing.MAX_SKETCHES) // 3 + 1024 <= trust.MAX_ANSWER_BODY_BYTES
