"""The chain's child process, over its pipes as the agent drives it: readied from the
order's sizes, seeded, committed, revealed; and NumPy where onnxruntime is missing."""

import asyncio
import sys

import numpy as np
import pytest

from gpu_share.agent.challenges import child
from gpu_share.agent.challenges.answering import ChildFailed, chain_process
from gpu_share.challenge.numpy_chain import NumpyChain
from gpu_share.protocol.trust import (
    ChallengeCommitted,
    ChallengeKind,
    ChallengeOrder,
    ChallengeParams,
    ChallengeSample,
    decode,
)

SEED = "ab" * 16
PARAMS = ChallengeParams(
    kind=ChallengeKind.CPU,
    width=32,
    rows=64,
    steps=9,
    sketch_rows=8,
    samples=2,
    deadline_sec=50,
    target_sec=4,
)
ORDER = ChallengeOrder(
    id="chl_test", kind=ChallengeKind.CPU, target="cpu", claimed_model="2 cores", params=PARAMS
)


async def test_the_child_readies_then_commits_then_reveals_what_the_reference_gives() -> None:
    pytest.importorskip("onnxruntime")
    reference = NumpyChain(SEED, child.shape_of(PARAMS))
    sketches = reference.run()
    asked = ChallengeCommitted(
        samples=[ChallengeSample(step=0, chunk=3), ChallengeSample(step=8, chunk=7)]
    )
    async with chain_process(child.ChildSetup(params=PARAMS), ORDER) as chain:
        ready = await chain.ready(60)
        assert ready.engine == "onnxruntime CPU FP32"
        commit = await chain.commit(SEED, 60)
        raw = np.frombuffer(decode(commit.sketches), dtype="<i4")
        assert np.array_equal(raw.reshape(sketches.shape), sketches)
        reveal = await chain.reveal(asked, 60)
    for sample, answer in zip(asked.samples, reveal.samples, strict=True):
        expected = reference.reveal(sample.step, sample.chunk)
        assert (answer.step, answer.chunk) == (sample.step, sample.chunk)
        assert decode(answer.before) == expected.before
        assert decode(answer.source) == expected.source
        assert decode(answer.after) == expected.after


def test_without_onnxruntime_the_chain_runs_in_numpy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import onnxruntime now fails
    chain, engine = child.prepare(child.ChildSetup(params=PARAMS))
    assert engine.startswith("NumPy FP32")
    chain.load(SEED)
    reference = NumpyChain(SEED, child.shape_of(PARAMS))
    assert np.array_equal(chain.run(), reference.run())


def test_a_shape_no_coordinator_would_size_is_refused() -> None:
    one_chunk = PARAMS.model_copy(update={"rows": 16, "sketch_rows": 16})
    with pytest.raises(child.ChallengeRefused, match="two chunks"):
        child.prepare(child.ChildSetup(params=one_chunk))


async def test_a_child_that_dies_is_reported_with_what_it_said() -> None:
    one_chunk = PARAMS.model_copy(update={"rows": 16, "sketch_rows": 16})
    async with chain_process(child.ChildSetup(params=one_chunk), ORDER) as chain:
        with pytest.raises(ChildFailed, match=r"exited with 1: .*two chunks"):
            await asyncio.wait_for(chain.ready(60), 120)
