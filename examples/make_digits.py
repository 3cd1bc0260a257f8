"""Build the example model: a digits classifier as ONNX, plus a few rows to feed it.

Trains on scikit-learn's bundled 8x8 digits (no download), converts with skl2onnx
with ZipMap disabled so every output is a plain tensor, and writes into the package
(`src/gpu_share/examples/`, shipped so `gpu-share up` can demonstrate an invoke):

    digits.onnx        "input" float32[?,64] -> "label" int64[?], "probabilities" float32[?,10]
    digits_inputs.npz  "input" float32[8,64]: held-out rows the model did not train on

Run it with `python examples/make_digits.py`; re-running rewrites the same model.
"""

from pathlib import Path

import numpy as np
from sklearn.datasets import load_digits
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import train_test_split
from sklearn.pipeline import Pipeline, make_pipeline
from sklearn.preprocessing import StandardScaler

TARGET = Path(__file__).resolve().parents[1] / "src" / "gpu_share" / "examples"
MODEL_PATH = TARGET / "digits.onnx"
INPUTS_PATH = TARGET / "digits_inputs.npz"
SAMPLE_ROWS = 8


def train() -> tuple[Pipeline, np.ndarray, np.ndarray]:
    """The classifier, plus held-out rows and labels it did not train on (well under a second)."""
    digits = load_digits()
    features = digits.data.astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(
        features, digits.target, test_size=0.2, random_state=0, stratify=digits.target
    )
    classifier = make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000, random_state=0))
    classifier.fit(x_train, y_train)
    return classifier, x_test, y_test


def main() -> None:
    # Imported here, not at the top: tests import train() and skl2onnx takes seconds to load.
    from skl2onnx import to_onnx
    from skl2onnx.common.data_types import FloatTensorType

    classifier, x_test, y_test = train()
    model = to_onnx(
        classifier,
        initial_types=[("input", FloatTensorType([None, x_test.shape[1]]))],
        options={LogisticRegression: {"zipmap": False}},  # plain tensors, not a list of dicts
        target_opset=17,
    )
    MODEL_PATH.write_bytes(model.SerializeToString())
    np.savez(INPUTS_PATH, input=x_test[:SAMPLE_ROWS])

    print(f"held-out accuracy {classifier.score(x_test, y_test):.3f}")
    print(f"wrote {MODEL_PATH.name} ({MODEL_PATH.stat().st_size} bytes)")
    print(f"wrote {INPUTS_PATH.name} ({INPUTS_PATH.stat().st_size} bytes)")
    print(f"expected labels {classifier.predict(x_test[:SAMPLE_ROWS]).tolist()}")


if __name__ == "__main__":
    main()
