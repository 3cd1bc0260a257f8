"""How big a challenge is, from what the hardware claims to be.

The chain should take `target_sec` at the claimed rate (a GPU's datasheet FP16 rate, a
CPU's cores at the baseline's per-core rate) and its state should fill `memory_share`
of the claimed memory. The state is `rows × width` entries (2 bytes on a GPU, 4 on a
CPU); the steps are what is left of the work once the rows are chosen. Work too small
for a full-width state (tests scale everything down) narrows the rows first.

The chunk of rows a sketch covers balances what travels: the commitment carries one
int32 per chunk and step, the reveal three packed chunks per sample. Plain arithmetic:
the coordinator sizes challenges without importing NumPy.
"""

from dataclasses import dataclass
from enum import StrEnum


class Kind(StrEnum):
    GPU = "gpu"  # FP16 on the claimed GPU
    CPU = "cpu"  # FP32 on the claimed cores


# FP16 holds every integer up to 2048 exactly: a row times a column of ±1/0 entries
# never leaves that range, whatever order the hardware sums in.
MAX_WIDTH = 2048
WIDTH = {Kind.GPU: MAX_WIDTH, Kind.CPU: 1024}
ELEMENT_BYTES = {Kind.GPU: 2, Kind.CPU: 4}
MIN_WIDTH = 16
MIN_SKETCH_ROWS = 8
MAX_SKETCH_ROWS = 4096
MIN_STEPS = 8
MAX_STEPS = 1024
MAX_ROWS = 1 << 26
MAX_SAMPLES = 8
MAX_SKETCHES = 1 << 21  # int32s in a commitment (8 MiB)
MAX_REVEAL_BYTES = 12 << 20  # packed rows in a reveal
ROWS_CHECKED = 64  # rows of each revealed chunk the coordinator recomputes


@dataclass(frozen=True)
class Shape:
    """The sizes of one chain; everything else follows from the seed."""

    kind: Kind
    width: int  # n: entries per row, the inner dimension of X·B
    rows: int  # h: rows of the state
    steps: int  # K: products in the chain
    sketch_rows: int  # C: rows per sketch (and per revealed chunk)

    @property
    def chunks(self) -> int:
        return self.rows // self.sketch_rows

    @property
    def flops(self) -> int:
        """Multiply-adds of the products, counted twice: what the rates are measured in."""
        return 2 * self.steps * self.rows * self.width * self.width

    @property
    def chunk_bytes(self) -> int:
        """One chunk of rows packed two bits an entry."""
        return self.sketch_rows * self.width // 4

    @property
    def sketch_count(self) -> int:
        return self.steps * self.chunks

    @property
    def state_bytes(self) -> int:
        return self.rows * self.width * ELEMENT_BYTES[self.kind]

    def reveal_bytes(self, samples: int) -> int:
        return 3 * samples * self.chunk_bytes

    def problems(self, samples: int) -> list[str]:
        """Why this shape is not one `size` could have made (a hostile or broken order)."""
        found = []
        if not MIN_WIDTH <= self.width <= MAX_WIDTH or self.width % 4:
            found.append(f"width {self.width} is not a multiple of 4 in {MIN_WIDTH}…{MAX_WIDTH}")
        if not MIN_SKETCH_ROWS <= self.sketch_rows <= MAX_SKETCH_ROWS:
            found.append(f"sketch_rows {self.sketch_rows} is outside the bounds")
        if self.rows > MAX_ROWS or self.rows % self.sketch_rows or self.chunks < 2:
            found.append(f"rows {self.rows} is not at least two chunks of {self.sketch_rows}")
        if not MIN_STEPS <= self.steps <= MAX_STEPS:
            found.append(f"steps {self.steps} is outside {MIN_STEPS}…{MAX_STEPS}")
        if self.sketch_count > MAX_SKETCHES:
            found.append(f"{self.sketch_count} sketches is over {MAX_SKETCHES}")
        if not 1 <= samples <= MAX_SAMPLES or self.reveal_bytes(samples) > MAX_REVEAL_BYTES:
            found.append(f"{samples} samples of {self.chunk_bytes} bytes do not fit a reveal")
        return found


class CannotSize(ValueError):
    """No shape within the bounds does what was asked."""


def _sketch_rows(rows: int, steps: int, width: int, samples: int) -> int:
    """The chunk (a power of two) that makes the commitment and the reveal smallest together,
    within their bounds."""
    best: tuple[int, int] | None = None
    candidate = MIN_SKETCH_ROWS
    while candidate <= MAX_SKETCH_ROWS and 2 * candidate <= max(rows, 2 * MIN_SKETCH_ROWS):
        commit = steps * (rows // candidate) * 4
        reveal = 3 * samples * candidate * width // 4
        fits = steps * (rows // candidate) <= MAX_SKETCHES and reveal <= MAX_REVEAL_BYTES
        if fits and (best is None or commit + reveal < best[0]):
            best = (commit + reveal, candidate)
        candidate *= 2
    if best is None:
        raise CannotSize(f"no chunk keeps {steps} steps of {rows} rows within the bounds")
    return best[1]


def size(
    kind: Kind,
    *,
    rate_flops: float,
    memory_bytes: float,
    target_sec: float,
    memory_share: float,
    samples: int,
    scale: float = 1.0,
) -> Shape:
    """The chain for hardware that claims `rate_flops` and `memory_bytes`; `scale` shrinks
    work and memory alike (tests)."""
    work = rate_flops * target_sec * scale
    state_bytes = memory_bytes * memory_share * scale
    if work <= 0 or state_bytes <= 0:
        raise CannotSize("a challenge needs a positive rate and memory")
    width = WIDTH[kind]
    while True:
        by_memory = int(state_bytes // (width * ELEMENT_BYTES[kind]))
        by_work = int(work // (2 * width * width * MIN_STEPS))
        rows = min(by_memory, by_work, MAX_ROWS)
        if rows >= 2 * MIN_SKETCH_ROWS or width <= MIN_WIDTH:
            break
        width //= 2
    rows = max(rows, 2 * MIN_SKETCH_ROWS)
    steps = _steps(work, rows, width)
    sketch_rows = _sketch_rows(rows, steps, width, samples)
    rows = max(rows // sketch_rows, 2) * sketch_rows
    shape = Shape(kind, width, rows, _steps(work, rows, width), sketch_rows)
    if problems := shape.problems(samples):
        raise CannotSize("; ".join(problems))
    return shape


def _steps(work: float, rows: int, width: int) -> int:
    return min(max(round(work / (2 * rows * width * width)), MIN_STEPS), MAX_STEPS)
