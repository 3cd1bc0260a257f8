"""Example files shipped with the package, so `gpu-share up` can show a working invoke.

`digits.onnx` classifies 8x8 digit images ("input" float32[?,64] → "label" int64[?],
"probabilities" float32[?,10]); `digits_inputs.npz` holds 8 rows it never trained
on. Both are built by `examples/make_digits.py` from scikit-learn's bundled data.
"""

from pathlib import Path

HERE = Path(__file__).resolve().parent
DIGITS_MODEL = HERE / "digits.onnx"
DIGITS_INPUTS = HERE / "digits_inputs.npz"
DIGITS_EXPECTED_LABELS = [7, 6, 3, 7, 7, 3, 2, 8]
