"""One challenge's chain in a child process (`python -m gpu_share.agent.challenges.child`).

Like the benchmarks' measuring child (`benchmarks.local`), it keeps the CUDA context and
the device memory out of the agent and dies with them. It speaks JSON lines:

    in  ChildSetup         the sizes, from the order: it imports, builds the graphs and
    out ChildReady         takes the state's memory before the clock starts
    in  ChildSeed          the seed, from the coordinator's start
    out ChallengeCommit    as soon as the chain has run
    in  ChallengeCommitted the samples asked for
    out ChallengeReveal    then it exits

Between the commit and the reveal it holds what it kept of the chain (`DeviceChain`).
The chain runs on onnxruntime's CUDA provider in FP16 for a GPU, its CPU provider in
FP32 for a CPU node, and in NumPy where onnxruntime is missing (a GPU challenge only
when its state is small enough for the host: a GPU without a working CUDA runtime
cannot prove itself).
"""

import base64
import importlib
import os
import sys
from typing import Any

from pydantic import BaseModel, Field

from gpu_share.challenge.numpy_chain import NumpyChain, RevealedChunks
from gpu_share.challenge.sizing import Kind, Shape
from gpu_share.protocol.trust import (
    ChallengeCommit,
    ChallengeCommitted,
    ChallengeKind,
    ChallengeParams,
    ChallengeReveal,
    RevealedSample,
)

# Packed states kept to answer from without a second run. Copying every state out costs a
# pass over it per step, which counts against the commit: only small chains keep them.
KEEP_BYTES = 16 * 1024 * 1024
NUMPY_MAX_STATE_BYTES = 256 * 1024 * 1024  # a GPU challenge on the host only this small


class ChildSetup(BaseModel):
    params: ChallengeParams
    threads: int = Field(default=1, ge=1, le=4096)
    keep_bytes: int = Field(default=KEEP_BYTES, ge=0)


class ChildReady(BaseModel):
    engine: str


class ChildSeed(BaseModel):
    seed: str = Field(pattern="^[0-9a-f]{32}$")


class ChallengeRefused(Exception):
    """This machine cannot run the chain it was given."""


def shape_of(params: ChallengeParams) -> Shape:
    shape = Shape(
        Kind(params.kind.value), params.width, params.rows, params.steps, params.sketch_rows
    )
    if problems := shape.problems(params.samples):
        raise ChallengeRefused("; ".join(problems))
    return shape


class HostChain:
    """The NumPy chain behind the same calls as `DeviceChain`."""

    def __init__(self, shape: Shape) -> None:
        self.shape = shape
        self.chain: NumpyChain | None = None

    def load(self, seed: str) -> None:
        self.chain = NumpyChain(seed, self.shape)

    def run(self) -> Any:
        assert self.chain is not None
        return self.chain.run()

    def reveal(self, asked: list[tuple[int, int]]) -> list[RevealedChunks]:
        assert self.chain is not None
        return [self.chain.reveal(t, c) for t, c in asked]

    def close(self) -> None:
        self.chain = None


def prepare(setup: ChildSetup) -> tuple[Any, str]:
    """The chain on the best engine here, before the seed; and the engine's name."""
    shape = shape_of(setup.params)
    on_gpu = setup.params.kind is ChallengeKind.GPU
    try:
        engine = importlib.import_module("gpu_share.agent.benchmarks.engine")
        device_chain = importlib.import_module("gpu_share.agent.challenges.device_chain")
        place = engine.Place.gpu(0) if on_gpu else engine.Place.cpu(setup.threads)
        chain = device_chain.DeviceChain(shape, place, keep_bytes=setup.keep_bytes)
        return chain, f"onnxruntime {'CUDA FP16' if on_gpu else 'CPU FP32'}"
    except ImportError as exc:
        missing = str(exc)
    except Exception as exc:  # EngineError: no CUDA provider, no device, no kernel
        if not on_gpu:
            raise
        missing = str(exc)
    if on_gpu and shape.rows * shape.width * 4 > NUMPY_MAX_STATE_BYTES:
        raise ChallengeRefused(f"no GPU engine here ({missing}); the host cannot stand in")
    return HostChain(shape), f"NumPy FP32 ({missing})"


def commit_of(sketches: Any) -> ChallengeCommit:
    raw = sketches.astype("<i4").tobytes()
    return ChallengeCommit(sketches=base64.b64encode(raw).decode())


def reveal_of(chain: Any, committed: ChallengeCommitted) -> ChallengeReveal:
    """The samples asked for, from a chain that ran (`DeviceChain`, `HostChain`, or a
    `NumpyChain` itself)."""
    asked = [(s.step, s.chunk) for s in committed.samples]
    if isinstance(chain, NumpyChain):
        revealed: list[RevealedChunks] = [chain.reveal(t, c) for t, c in asked]
    else:
        revealed = chain.reveal(asked)

    def text(data: bytes) -> str:
        return base64.b64encode(data).decode()

    return ChallengeReveal(
        samples=[
            RevealedSample(
                step=t, chunk=c, before=text(r.before), source=text(r.source), after=text(r.after)
            )
            for (t, c), r in zip(asked, revealed, strict=True)
        ]
    )


def main() -> None:
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # whatever a library prints goes to stderr; stdout carries the answers

    def say(message: BaseModel) -> None:
        answers.write(message.model_dump_json() + "\n")
        answers.flush()

    chain, engine = prepare(ChildSetup.model_validate_json(sys.stdin.readline()))
    say(ChildReady(engine=engine))
    line = sys.stdin.readline()
    if not line:
        return  # the agent gave up before the start
    chain.load(ChildSeed.model_validate_json(line).seed)
    say(commit_of(chain.run()))
    line = sys.stdin.readline()
    if line:  # none: the commit ended the challenge, or the agent is stopping
        say(reveal_of(chain, ChallengeCommitted.model_validate_json(line)))
    chain.close()


if __name__ == "__main__":
    main()
