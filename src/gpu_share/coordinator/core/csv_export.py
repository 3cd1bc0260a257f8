"""The one CSV writer: every file the coordinator exports (a tenant's usage, a provider's
earnings, a payout batch) is written by `csv_text`.

People open these files in a spreadsheet, and part of what they hold was written by
someone else: a node reports its hostname and GPU models, a provider names itself and
its bank account. A spreadsheet runs a cell that begins with `=`, `+`, `-` or `@` (and,
in some, a tab or a carriage return) as a formula, so such a cell is written with a
leading `'`, which shows it as the text it is (OWASP, "CSV injection"). A plain number
such as "-2.5" is left as it is: it runs nothing, and a negative amount stays a number.
"""

import csv
import io
import re
from collections.abc import Iterable, Sequence

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
_PLAIN_NUMBER = re.compile(r"-?[0-9]+(\.[0-9]+)?", re.ASCII)

Cell = str | int | float | bool | None


def text_cell(value: Cell) -> str:
    """A cell as a spreadsheet should show it: None is empty, a formula is text."""
    cell = "" if value is None else str(value)
    if cell.startswith(FORMULA_STARTS) and not _PLAIN_NUMBER.fullmatch(cell):
        return "'" + cell
    return cell


def csv_text(header: Sequence[str], rows: Iterable[Sequence[Cell]]) -> str:
    """The header and the rows as RFC 4180 CSV. Its CRLF line ends also make the writer
    quote a cell holding a lone CR, which a reader would otherwise take for a line end."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")
    writer.writerow([text_cell(name) for name in header])
    writer.writerows([text_cell(value) for value in row] for row in rows)
    return out.getvalue()
