"""How a simulated node answers a hardware challenge (docs/trust.md): honestly, with the
NumPy reference, or in one of the ways a cheat would, over the real protocol.

The chains are tiny (tests scale challenges down with `challenge_scale`), so the node
keeps every state and the reveal recomputes nothing.
"""

import base64
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from gpu_share.agent.challenges.child import commit_of, reveal_of, shape_of
from gpu_share.agent.client import CoordinatorClient
from gpu_share.challenge import streams
from gpu_share.challenge.numpy_chain import NumpyChain
from gpu_share.protocol.trust import ChallengeOrder, ChallengeVerdict


@dataclass(frozen=True)
class ChallengeAnswer:
    """What the node does; every field off is an honest, prompt node."""

    made_up_sketches: bool = False  # commits numbers it never computed
    tampered_rows: bool = False  # reveals a row changed after the commit
    other_matrix: bool = False  # computes, consistently, a chain with another B
    before_commit: Callable[[], object] | None = None  # e.g. the test moves the clock
    before_reveal: Callable[[], object] | None = None
    commit: bool = True  # False: starts the challenge and never commits
    reveal: bool = True  # False: commits and never reveals


@dataclass
class Answered:
    verdict: ChallengeVerdict | None  # None when the node stopped answering
    chain: NumpyChain


def _tamper(text: str) -> str:
    data = bytearray(base64.b64decode(text))
    data[0] = data[0] ^ 0b01 if data[0] & 0b11 != 0b10 else data[0] ^ 0b11  # 0↔1, 2→1
    return base64.b64encode(bytes(data)).decode()


async def answer(
    client: CoordinatorClient, order: ChallengeOrder, how: ChallengeAnswer
) -> Answered:
    started = await client.start_challenge(order.id)
    chain = NumpyChain(started.seed, shape_of(started.params))
    if how.other_matrix:
        other = streams.matrix_b("f" * 32, chain.shape.width)
        chain.inputs = dataclasses.replace(chain.inputs, b=other)
    sketches = chain.run()
    if how.made_up_sketches:
        sketches = np.random.default_rng(7).integers(-999, 999, size=sketches.shape)
    if how.before_commit:
        how.before_commit()
    if not how.commit:
        return Answered(None, chain)
    committed = await client.commit_challenge(order.id, commit_of(sketches))
    if committed.verdict is not None:
        return Answered(committed.verdict, chain)
    if how.before_reveal:
        how.before_reveal()
    if not how.reveal:
        return Answered(None, chain)
    reveal = reveal_of(chain, committed)
    if how.tampered_rows:
        first = reveal.samples[0]
        reveal.samples[0] = first.model_copy(update={"after": _tamper(first.after)})
    return Answered(await client.reveal_challenge(order.id, reveal), chain)
