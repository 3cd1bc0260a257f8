"""SqueezeNet 1.1 built in code with seeded random weights: a real image model, no download.

The architecture is torchvision's `squeezenet1_1`: a 3x3/64 stride-2 convolution, three
max pools (3x3, stride 2, ceil mode) between eight fire modules (a 1x1 squeeze, then
1x1 and 3x3 expands concatenated), a 1x1 convolution to 1000 classes and a global
average pool. Input float32[1, 3, 224, 224], output float32[1, 1000]. The weights are He
initialised from a fixed seed, so the compute is the real model's and the file is the
same on every machine; the labels it predicts mean nothing.

Run `python bench/peers/squeezenet.py` to build it and time a forward pass.
"""

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
from onnx import NodeProto, TensorProto, helper, numpy_helper

CACHE_DIR = Path(__file__).resolve().parent / ".cache"
INPUT_SHAPE = (1, 3, 224, 224)
# (squeeze, expand) channels of fire2 … fire9; a max pool comes before fire4 and fire6.
FIRES = [(16, 64), (16, 64), (32, 128), (32, 128), (48, 192), (48, 192), (64, 256), (64, 256)]
POOL_BEFORE = {2, 4}  # indexes into FIRES
CLASSES = 1000


class _Graph:
    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[NodeProto] = []
        self.initializers: list[TensorProto] = []

    def conv_relu(
        self, x: str, name: str, c_in: int, c_out: int, kernel: int, stride: int = 1, pad: int = 0
    ) -> str:
        fan_in = c_in * kernel * kernel
        weight = self.rng.standard_normal((c_out, c_in, kernel, kernel)) * np.sqrt(2 / fan_in)
        self.initializers += [
            numpy_helper.from_array(weight.astype(np.float32), f"{name}.w"),
            numpy_helper.from_array(np.zeros(c_out, dtype=np.float32), f"{name}.b"),
        ]
        self.nodes += [
            helper.make_node(
                "Conv",
                [x, f"{name}.w", f"{name}.b"],
                [f"{name}.conv"],
                kernel_shape=[kernel, kernel],
                strides=[stride, stride],
                pads=[pad] * 4,
            ),
            helper.make_node("Relu", [f"{name}.conv"], [name]),
        ]
        return name

    def max_pool(self, x: str, name: str) -> str:
        self.nodes.append(
            helper.make_node(
                "MaxPool", [x], [name], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1
            )
        )
        return name

    def fire(self, x: str, name: str, c_in: int, squeeze: int, expand: int) -> str:
        s = self.conv_relu(x, f"{name}.squeeze", c_in, squeeze, 1)
        e1 = self.conv_relu(s, f"{name}.expand1x1", squeeze, expand, 1)
        e3 = self.conv_relu(s, f"{name}.expand3x3", squeeze, expand, 3, pad=1)
        self.nodes.append(helper.make_node("Concat", [e1, e3], [name], axis=1))
        return name


def squeezenet(seed: int = 0) -> bytes:
    """The ONNX model's bytes; input `data`, output `logits`."""
    g = _Graph(seed)
    x = g.conv_relu("data", "conv1", 3, 64, 3, stride=2)
    x = g.max_pool(x, "pool1")
    channels = 64
    for i, (squeeze, expand) in enumerate(FIRES):
        if i in POOL_BEFORE:
            x = g.max_pool(x, f"pool{i + 1}")
        x = g.fire(x, f"fire{i + 2}", channels, squeeze, expand)
        channels = 2 * expand
    x = g.conv_relu(x, "conv10", channels, CLASSES, 1)
    g.nodes += [
        helper.make_node("GlobalAveragePool", [x], ["pooled"]),
        helper.make_node("Flatten", ["pooled"], ["logits"], axis=1),
    ]
    graph = helper.make_graph(
        g.nodes,
        "squeezenet1_1",
        [helper.make_tensor_value_info("data", TensorProto.FLOAT, list(INPUT_SHAPE))],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, CLASSES])],
        g.initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return bytes(model.SerializeToString())


def cached_squeezenet(seed: int = 0, cache_dir: Path = CACHE_DIR) -> Path:
    """Build once per seed into the (git-ignored) cache folder."""
    path = cache_dir / f"squeezenet1_1-seed{seed}.onnx"
    if not path.exists():
        cache_dir.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".partial")
        partial.write_bytes(squeezenet(seed))
        partial.replace(path)
    return path


def sample_input(seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).random(INPUT_SHAPE, dtype=np.float32)


def main() -> None:
    import onnxruntime as ort

    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    path = cached_squeezenet()
    options = ort.SessionOptions()
    options.intra_op_num_threads = args.threads
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    x = sample_input()
    (logits,) = session.run(None, {"data": x})
    times = []
    for _ in range(args.runs):
        start = time.perf_counter()
        session.run(None, {"data": x})
        times.append((time.perf_counter() - start) * 1000)
    params = sum(int(np.prod(t.dims)) for t in _onnx_initializers(path))
    print(f"{path} ({path.stat().st_size / 2**20:.1f} MiB, {params / 1e6:.2f} M parameters)")
    print(f"logits {logits.shape}, argmax {int(logits.argmax())}")
    print(f"forward on {args.threads} threads: p50 {statistics.median(times):.1f} ms")


def _onnx_initializers(path: Path) -> list[TensorProto]:
    import onnx

    return list(onnx.load(str(path)).graph.initializer)


if __name__ == "__main__":
    main()
