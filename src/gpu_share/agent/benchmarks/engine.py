"""The measurement engine: one ONNX graph on one device, its tensors kept on that device.

Benchmarks time matrix multiplies and copies through it (`ort_device`); hardware
challenges run their own graphs through it. An input is copied to the device once, when
it is bound; an output is allocated on the device by the first run and written in place
by every later one; only `output` brings a tensor back to the host. So a run moves no
data between host and device, and what a clock around it measures is the device's work.

It runs on onnxruntime, which every agent install has: its CUDA provider on a GPU
(onnxruntime-gpu), its CPU provider elsewhere. onnxruntime quietly runs a graph on the
CPU when it cannot use CUDA (a CPU-only build, a CUDA or cuDNN library missing, no such
device) and, node by node, where the CUDA provider lacks a kernel; a session here forbids
the second and checks for the first, so a CPU never stands in for a GPU
(`ProviderNotUsed`).

A run is synchronous: at the end of each run onnxruntime waits for the provider's stream
(`cudaStreamSynchronize`) unless the run option `disable_synchronize_execution_providers`
is "1", which this module never sets. `synchronize` asks the provider as well
(`IOBinding.synchronize_outputs`, a `cudaDeviceSynchronize` in the CUDA provider).

onnxruntime, onnx and numpy are imported inside the functions: the agent imports this
package, and must not load them (see `compute`).
"""

import functools
import importlib
from dataclasses import dataclass
from typing import Any

CUDA_PROVIDER = "CUDAExecutionProvider"
CPU_PROVIDER = "CPUExecutionProvider"
OPSET = 17  # ai.onnx: bfloat16 MatMul and Cast since 13; onnxruntime 1.17 reads up to 20
IR_VERSION = 8  # onnxruntime 1.17, the oldest the agent installs, reads up to 9
BFLOAT16 = "tensor(bfloat16)"
_CPU_FALLBACK_REFUSED = "fallback to CPU EP has been explicitly disabled"


class EngineError(Exception):
    """A graph could not be set up or run on the device asked for."""


class ProviderNotUsed(EngineError):
    """onnxruntime would run the graph somewhere else than asked: not a measurement of it."""


class UnsupportedGraph(EngineError):
    """The provider has no kernel for a node of the graph (e.g. a bfloat16 MatMul on a CPU)."""


@dataclass(frozen=True)
class Place:
    """Where a graph runs and its tensors live: CUDA device `device_id`, or the CPU."""

    provider: str
    device_id: int = 0
    tf32: bool = False  # CUDA: float32 MatMul on tensor cores (onnxruntime's `use_tf32`)
    threads: int = 0  # CPU: threads of one operator; 0 lets onnxruntime choose

    @classmethod
    def gpu(cls, device_id: int, *, tf32: bool = False) -> "Place":
        return cls(CUDA_PROVIDER, device_id=device_id, tf32=tf32)

    @classmethod
    def cpu(cls, threads: int = 0) -> "Place":
        return cls(CPU_PROVIDER, threads=threads)

    @property
    def on_gpu(self) -> bool:
        return self.provider == CUDA_PROVIDER

    @property
    def device_type(self) -> str:
        """As onnxruntime's OrtValue and IOBinding name the device."""
        return "cuda" if self.on_gpu else "cpu"


def onnx_model(nodes: list[Any], inputs: list[Any], outputs: list[Any]) -> bytes:
    """A graph of `onnx.helper` nodes and value infos, at the opset and IR version every
    onnxruntime the agent installs can read."""
    helper = importlib.import_module("onnx.helper")
    graph = helper.make_graph(nodes, "gpu_share", inputs, outputs)
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION
    )
    serialized: bytes = model.SerializeToString()
    return serialized


@functools.cache
def _cast_model(source: int, target: int) -> bytes:
    """y = Cast(x) for a tensor of any shape: bfloat16 in and out of the device."""
    helper = importlib.import_module("onnx.helper")
    return onnx_model(
        [helper.make_node("Cast", ["x"], ["y"], to=target)],
        [helper.make_tensor_value_info("x", source, None)],
        [helper.make_tensor_value_info("y", target, None)],
    )


def _numpy_dtype(onnx_type: str) -> Any:
    """'tensor(float)' → float32, 'tensor(int64)' → int64 …"""
    numpy = importlib.import_module("numpy")
    name = onnx_type.removeprefix("tensor(").removesuffix(")")
    try:
        return numpy.dtype({"float": "float32", "double": "float64"}.get(name, name))
    except TypeError as exc:
        raise EngineError(f"numpy has no type for {onnx_type}") from exc


class DeviceSession:
    """One graph on one device, its inputs and outputs bound there by name.

        session = DeviceSession(model, Place.gpu(0))
        session.bind_input("a", a)   # copied to the GPU now, once
        session.bind_input("b", b)
        session.bind_output("c")     # left on the GPU
        session.run()                # as often as needed: no host transfer
        c = session.output("c")      # back to the host, as numpy

    Arrays are cast to the type the graph declares for the input; numpy has no bfloat16,
    so a bfloat16 input is given as float32 and rounded on the device, and a bfloat16
    output is read back as float32. Every node must run on the provider asked for.
    """

    def __init__(self, model: bytes, place: Place) -> None:
        ort = importlib.import_module("onnxruntime")
        if place.provider not in ort.get_available_providers():
            hint = " (a CPU-only build: pip install onnxruntime-gpu)" if place.on_gpu else ""
            raise ProviderNotUsed(f"onnxruntime {ort.__version__} has no {place.provider}{hint}")
        self.place = place
        self.ort: Any = ort
        self.session: Any = self._open(model)
        used = self.session.get_providers()
        if not used or used[0] != place.provider:
            raise self._not_used(used)
        self.binding: Any = self.session.io_binding()
        self.types = {arg.name: arg.type for arg in self.session.get_inputs()}
        self.output_types = {arg.name: arg.type for arg in self.session.get_outputs()}
        self.inputs: dict[str, Any] = {}  # the OrtValues bound: they must outlive the binding
        self.outputs: dict[str, Any] = {}  # in binding order; None until a run allocates it
        self.conversions: dict[str, DeviceSession] = {}  # what made each bfloat16 input

    def _open(self, model: bytes) -> Any:
        ort, place = self.ort, self.place
        options = ort.SessionOptions()
        options.log_severity_level = 3  # errors only
        if place.on_gpu:
            options.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
            provider: Any = (
                place.provider,
                {
                    "device_id": str(place.device_id),
                    "use_tf32": "1" if place.tf32 else "0",
                    # Grow the memory arena by what is asked, not by doubling: a challenge's
                    # temporaries are gigabytes, and doubling past them runs out of VRAM.
                    "arena_extend_strategy": "kSameAsRequested",
                },
            )
        else:
            options.intra_op_num_threads = place.threads
            options.inter_op_num_threads = 1
            # Idle workers sleep: a spinning pool would take cores from a one-core copy.
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
            provider = place.provider
        not_implemented = importlib.import_module(
            "onnxruntime.capi.onnxruntime_pybind11_state"
        ).NotImplemented
        try:
            return ort.InferenceSession(model, options, providers=[provider])
        except not_implemented as exc:
            raise UnsupportedGraph(f"{place.provider}: {exc}") from exc
        except Exception as exc:
            if _CPU_FALLBACK_REFUSED not in str(exc):
                raise
            # Nodes went to the CPU: because CUDA lacks their kernels, or lacks everything.
            float32 = importlib.import_module("onnx").TensorProto.FLOAT
            probe = ort.InferenceSession(_cast_model(float32, float32), providers=[provider])
            used = probe.get_providers()
            if used[0] == place.provider:
                raise UnsupportedGraph(f"{place.provider} cannot run every node: {exc}") from exc
            raise self._not_used(used) from exc

    def _not_used(self, used: list[str]) -> ProviderNotUsed:
        return ProviderNotUsed(
            f"onnxruntime {self.ort.__version__} would run this graph on {', '.join(used)}, "
            f"not {self.place.provider} {self.place.device_id} (are CUDA and cuDNN installed?)"
        )

    def _declared(self, name: str, types: dict[str, str], what: str) -> str:
        try:
            return types[name]
        except KeyError:
            raise EngineError(f"the graph has no {what} {name!r}") from None

    def bind_input(self, name: str, array: Any) -> None:
        """Copy `array` to the device as input `name`, once; later runs read it there."""
        numpy = importlib.import_module("numpy")
        declared = self._declared(name, self.types, "input")
        if declared != BFLOAT16:
            self.bind_value(
                name, self._upload(numpy.ascontiguousarray(array, _numpy_dtype(declared)))
            )
            return
        on_host = numpy.ascontiguousarray(array, dtype=numpy.float32)
        conversion = self._converted(self._upload(on_host), to_bfloat16=True)
        self.bind_value(name, conversion.value("y"))
        replaced = self.conversions.pop(name, None)
        if replaced is not None:
            replaced.close()
        self.conversions[name] = conversion  # open while the binding reads its output

    def bind_value(self, name: str, value: Any) -> None:
        """Bind an OrtValue already on this device: another session's `value`, while that
        session stays open (its memory is that session's)."""
        self._declared(name, self.types, "input")
        self.binding.bind_ortvalue_input(name, value)
        self.inputs[name] = value
        for output in self.outputs:  # new inputs may give outputs another shape
            self.bind_output(output)

    def bind_output(self, name: str, *, on_host: bool = False) -> None:
        """Leave output `name` on the device (or, small ones read after every run, on the
        host): allocated by the next run, reused after it."""
        self._declared(name, self.output_types, "output")
        if on_host:
            self.binding.bind_output(name, "cpu")
        else:
            self.binding.bind_output(name, self.place.device_type, self.place.device_id)
        self.outputs[name] = None

    def bind_output_value(self, name: str, value: Any) -> None:
        """Write output `name` into an OrtValue already on this device: a buffer that runs
        take turns writing (a chain of steps ping-pongs between two)."""
        self._declared(name, self.output_types, "output")
        self.binding.bind_ortvalue_output(name, value)
        self.outputs[name] = value

    def run(self) -> None:
        self.session.run_with_iobinding(self.binding)
        if any(value is None for value in self.outputs.values()):
            # IOBinding keeps its outputs in the order they were first bound, as this dict does.
            for name, value in zip(self.outputs, self.binding.get_outputs(), strict=True):
                self.binding.bind_ortvalue_output(name, value)
                self.outputs[name] = value

    def value(self, name: str) -> Any:
        """Output `name` as the OrtValue on the device, to bind into another session."""
        value = self.outputs.get(name)
        if value is None:
            raise EngineError(f"output {name!r} is not bound or the session has not run")
        return value

    def output(self, name: str) -> Any:
        """Output `name` copied to the host, as a numpy array (bfloat16 as float32)."""
        value = self.value(name)
        if self.output_types[name] != BFLOAT16:
            return value.numpy()
        conversion = self._converted(value, to_bfloat16=False)
        try:
            return conversion.value("y").numpy()
        finally:
            conversion.close()

    def synchronize(self) -> None:
        self.binding.synchronize_outputs()

    def close(self) -> None:
        """Let go of the device memory this session holds."""
        self.binding.clear_binding_inputs()
        self.binding.clear_binding_outputs()
        self.inputs.clear()
        self.outputs.clear()
        for conversion in self.conversions.values():
            conversion.close()
        self.conversions.clear()

    def _upload(self, array: Any) -> Any:
        """A copy of `array` on the device: the caller may change or drop its array after."""
        if not self.place.on_gpu:
            array = array.copy()  # onnxruntime would read a host array in place
        return self.ort.OrtValue.ortvalue_from_numpy(
            array, self.place.device_type, self.place.device_id
        )

    def _converted(self, value: Any, *, to_bfloat16: bool) -> "DeviceSession":
        """A Cast of `value` between float32 and bfloat16 on this device, run: its output
        "y" is the converted value, for as long as it stays open."""
        tensor_proto = importlib.import_module("onnx").TensorProto
        float32, bfloat16 = tensor_proto.FLOAT, tensor_proto.BFLOAT16
        model = _cast_model(float32, bfloat16) if to_bfloat16 else _cast_model(bfloat16, float32)
        cast = DeviceSession(model, Place(self.place.provider, device_id=self.place.device_id))
        cast.bind_value("x", value)
        cast.bind_output("y")
        cast.run()
        return cast
