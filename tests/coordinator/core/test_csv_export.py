"""The one CSV writer (core/csv_export.py): a cell a spreadsheet would run as a formula
is written as text; numbers, negative ones too, stay numbers; nothing else writes CSV."""

import csv
import io
import re
from pathlib import Path

import pytest

from gpu_share.coordinator.core.csv_export import csv_text, text_cell

COORDINATOR = Path(__file__).resolve().parents[3] / "src" / "gpu_share" / "coordinator"


@pytest.mark.parametrize(
    "formula",
    [
        '=HYPERLINK("http://x","y")',
        "+1+cmd|' /C calc'!A0",
        "-2+3",
        "@SUM(A1)",
        "\t=1",
        "\r=1",
        "-",
        "-1e5",
    ],
)
def test_a_cell_that_would_run_as_a_formula_is_written_as_text(formula: str) -> None:
    [row] = list(csv.reader(io.StringIO(csv_text(["cell"], [[formula]]))))[1:]
    assert row == ["'" + formula]


@pytest.mark.parametrize(
    ("value", "cell"),
    [("-2.5", "-2.5"), (-3, "-3"), (2.5, "2.5"), ("0", "0"), (None, ""), (True, "True")],
)
def test_numbers_and_plain_values_are_written_as_they_are(value: object, cell: str) -> None:
    assert text_cell(value) == cell  # type: ignore[arg-type]


def test_the_header_and_quoting_follow_rfc_4180() -> None:
    text = csv_text(["a", "b"], [['say "hi", =1', "x\ny\rz"]])
    assert list(csv.reader(io.StringIO(text, newline=""))) == [
        ["a", "b"],
        ['say "hi", =1', "x\ny\rz"],
    ]
    assert text.startswith("a,b\r\n")


def test_no_module_of_the_coordinator_but_the_writer_writes_csv() -> None:
    writers = sorted(
        str(path.relative_to(COORDINATOR))
        for path in COORDINATOR.rglob("*.py")
        if re.search(r"^(import csv|from csv import)\b", path.read_text("utf-8"), re.MULTILINE)
    )
    assert writers == ["core/csv_export.py"]
