"""What a checkpoint must be, per runtime, before it is kept (docs/billing.md, "Preempted
spot work").

A preempted attempt is charged up to its last checkpoint, the progress the next attempt
resumes from, so a checkpoint is money: a node (any node may be hostile) must not be
able to bill a tenant for bytes that resume nothing. Each is judged as it streams in,
before anything is stored, and a bad one is refused (422) and kept nowhere:

- ONNX jobs keep no checkpoints: nothing of theirs is stored, and their preempted
  attempts cost nothing.
- CatBoost (CPU or GPU) snapshots are CatBoost's own file (`TProgressHelper`): a
  length-prefixed label, "CPU" or "GPU", then the training's options as a
  length-prefixed JSON object (whose `task_type` is the label, with the loss function
  and the boosting options), then the progress itself. The header must parse and
  progress must follow; its size is bounded as any upload is (quota, max bytes).
"""

import json
import struct
from collections.abc import AsyncIterator

from gpu_share.coordinator.core.errors import ValidationFailed
from gpu_share.protocol.runtimes import RuntimeName

MAX_OPTIONS_BYTES = 1024 * 1024  # CatBoost's options JSON: a few KiB in practice
MIN_PROGRESS_BYTES = 16  # after the header, at least the first fields of the progress
_LABELS = (b"CPU", b"GPU")


def keeps_checkpoints(runtime: RuntimeName) -> bool:
    """Training runtimes snapshot their progress; inference has none to keep."""
    return runtime.kind == "train"


async def checked(runtime: RuntimeName, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """The checkpoint's bytes, as they come, once its head has shown it is one this runtime
    writes; raises `ValidationFailed` (nothing was stored) when it is not."""
    if not keeps_checkpoints(runtime):
        raise ValidationFailed(
            f"{runtime.value} jobs keep no checkpoints; the snapshot was not stored"
        )
    head = bytearray()
    stream = aiter(chunks)
    while (needed := _catboost_head(bytes(head))) > len(head):
        chunk = await anext(stream, None)
        if chunk is None:
            raise _refused(
                f"it ends after {len(head)} bytes, before the {needed} a CatBoost snapshot "
                "has at least"
            )
        head += chunk
    return _replay(bytes(head), stream)


async def _replay(head: bytes, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    yield head
    async for chunk in rest:
        yield chunk


def _catboost_head(head: bytes) -> int:
    """How many bytes the snapshot must have for its head to be judged: more than `head`
    holds while it is incomplete, at most its length once it is valid. Raises
    `ValidationFailed` as soon as what is there is not a CatBoost snapshot."""
    if len(head) < 4:
        return 4
    label_size = int(struct.unpack_from("<I", head, 0)[0])
    if label_size != 3:
        raise _refused("it does not start with CatBoost's CPU or GPU label")
    if len(head) < 11:
        return 11
    label = head[4:7]
    if label not in _LABELS:
        raise _refused(f"its label is {label!r}, not CatBoost's CPU or GPU")
    options_size = int(struct.unpack_from("<I", head, 7)[0])
    if not 2 <= options_size <= MAX_OPTIONS_BYTES:
        raise _refused(f"its options take {options_size} bytes")
    end = 11 + options_size
    if len(head) < end + MIN_PROGRESS_BYTES:
        return end + MIN_PROGRESS_BYTES
    try:
        options = json.loads(head[11:end])
    except ValueError as exc:
        raise _refused(f"its options are not JSON ({exc})") from exc
    if (
        not isinstance(options, dict)
        or options.get("task_type") != label.decode()
        or not {"loss_function", "boosting_options"} <= options.keys()
    ):
        raise _refused("its options are not a CatBoost training's")
    return end + MIN_PROGRESS_BYTES


def _refused(why: str) -> ValidationFailed:
    return ValidationFailed(f"the checkpoint is not a CatBoost snapshot: {why}; not stored")
