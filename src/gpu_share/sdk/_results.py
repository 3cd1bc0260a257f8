"""What a finished invoke produced, decoded only when asked for."""

from functools import cached_property
from typing import TYPE_CHECKING

from gpu_share.protocol.invokes import Invoke, Metrics
from gpu_share.sdk import _npz
from gpu_share.sdk.errors import GpuShareError

if TYPE_CHECKING:
    from gpu_share.sdk._npz import Array


class InvokeOutputs:
    """The outputs of a `done` invoke.

    `raw` holds the outputs file (NPZ for every runtime today) when the SDK could
    read it: inline in the answer, or a platform artifact fetched with your key. When
    the outputs went to your own storage (`outputs_upload`), `raw` is None and `url`
    says where they are. `arrays` decodes the NPZ (numpy needed) on first use.
    """

    def __init__(self, invoke: Invoke, raw: bytes | None) -> None:
        assert invoke.result is not None, "only a done invoke has outputs"
        self.invoke = invoke
        self.raw = raw
        self.url = invoke.result.outputs_url
        self.format = invoke.result.outputs_format

    @property
    def metrics(self) -> Metrics:
        assert self.invoke.result is not None
        return self.invoke.result.metrics

    @cached_property
    def arrays(self) -> "dict[str, Array]":
        if self.raw is None:
            raise GpuShareError(
                f"the outputs of invoke {self.invoke.id} went to {self.url} (your own storage); "
                "the SDK cannot read them from there: fetch them from that storage"
            )
        if self.format not in (None, "npz"):
            raise GpuShareError(f"the outputs are {self.format}, not NPZ; read .raw instead")
        return _npz.decode(self.raw)

    def __getitem__(self, name: str) -> "Array":
        return self.arrays[name]

    def __contains__(self, name: object) -> bool:
        return name in self.arrays

    def keys(self) -> list[str]:
        return list(self.arrays)

    def __repr__(self) -> str:
        where = f"{len(self.raw)} bytes" if self.raw is not None else f"at {self.url}"
        return f"<InvokeOutputs {self.invoke.id} {self.format or 'npz'} {where}>"
