"""An ONNX model's inputs and outputs, read from its file without loading its weights.

An ONNX file is one protobuf message (`ModelProto`, onnx/onnx.proto). Few of its fields
matter to an upload: the operator sets it imports (onnxruntime refuses a model that
imports none), the graph's inputs and outputs, and its initializers' names (an input an
initializer backs is a weight with a default, not something an invoke must feed) and
where their data lives. Everything else (the nodes, the weights, which are nearly all of
a model's bytes, doc strings) is stepped over by its length with a seek. So the file is
never read whole: checking a model costs memory for its names and shapes, whatever its
size, and a model over any in-memory cap is checked from the file it was streamed into.

Every field is checked to lie inside the message that holds it, with a wire type protobuf
knows, so text, a zip, a pickle or a model cut short is refused with the reason.
Weights stored outside the file (ONNX "external data") are refused: only this one file
is uploaded, and onnxruntime would find them nowhere.
"""

from collections.abc import Iterator
from typing import BinaryIO

from gpu_share.protocol.artifacts import Dimension, ModelSignature, ModelValue

MAX_LISTED = 256  # inputs and outputs recorded per model; more are counted, not kept
MAX_VALUES = 100_000  # graph inputs or outputs a model may declare
MAX_NAME_BYTES = 4096  # a value's name, an identifier
MAX_TYPE_DEPTH = 16  # sequence(map(int64, sequence(…))) nesting
MAX_RANK = 64
MAX_FIELDS = 2_000_000  # nodes, weights and values visited in all: seconds of reading

_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5
_WIRE_SIZE = {_I64: 8, _I32: 4}

# TensorProto.DataType, named as numpy names them where numpy has the type.
ELEMENT_TYPES = {
    1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64",
    8: "string", 9: "bool", 10: "float16", 11: "float64", 12: "uint32", 13: "uint64",
    14: "complex64", 15: "complex128", 16: "bfloat16", 17: "float8e4m3fn",
    18: "float8e4m3fnuz", 19: "float8e5m2", 20: "float8e5m2fnuz", 21: "uint4", 22: "int4",
    23: "float4e2m1", 24: "float8e8m0", 25: "uint2", 26: "int2", 27: "float6e2m3",
    28: "float6e3m2",
}  # fmt: skip


class NotOnnx(ValueError):
    """The file is not an ONNX model that can run here; the message says why."""


Field = tuple[int, int, int, int]  # number, wire type, value (or payload offset), length


def read_signature(model: BinaryIO, size: int) -> ModelSignature:
    """The model's inputs and outputs; raises `NotOnnx` naming what is wrong."""
    file = _Source(model)
    opsets = 0
    graphs: list[Field] = []
    for field in _fields(file, 0, size, "it"):
        number, wire = field[0], field[1]
        if number == 8:
            _expect(wire, _LEN, "opset_import")
            opsets += 1
        elif number == 7:
            _expect(wire, _LEN, "graph")
            graphs.append(field)
    if not graphs:
        raise NotOnnx("it holds no graph")
    if not opsets:
        raise NotOnnx(
            "it imports no operator set (opset_import), which onnxruntime requires; "
            "export it again with an opset"
        )
    graph = _Graph()
    for _, _, start, length in graphs:  # protobuf merges a repeated message field
        graph.read(file, start, start + length)
    inputs = [value for value in graph.inputs if value.name not in graph.initializers]
    if not graph.outputs:
        raise NotOnnx("its graph declares no outputs")
    return ModelSignature(
        inputs=inputs[:MAX_LISTED],
        outputs=graph.outputs[:MAX_LISTED],
        truncated=max(len(inputs), len(graph.outputs)) > MAX_LISTED,
    )


class _Source:
    """The model's file, and how many more fields reading it may visit: a file of millions
    of tiny fields would otherwise keep a worker thread busy for minutes."""

    def __init__(self, file: BinaryIO) -> None:
        self._file = file
        self.fields_left = MAX_FIELDS

    def seek(self, position: int) -> None:
        self._file.seek(position)

    def read(self, size: int) -> bytes:
        return self._file.read(size)


class _Graph:
    def __init__(self) -> None:
        self.inputs: list[ModelValue] = []
        self.outputs: list[ModelValue] = []
        self.initializers: set[str] = set()

    def read(self, file: _Source, start: int, end: int) -> None:
        for number, wire, offset, length in _fields(file, start, end, "the graph"):
            if number in (11, 12):
                side = "input" if number == 11 else "output"
                _expect(wire, _LEN, f"a graph {side}")
                values = self.inputs if number == 11 else self.outputs
                if len(values) >= MAX_VALUES:
                    raise NotOnnx(f"its graph declares more than {MAX_VALUES} {side}s")
                values.append(_value_info(file, offset, length, f"{side} #{len(values) + 1}"))
            elif number == 5:
                _expect(wire, _LEN, "an initializer")
                self.initializers.add(_initializer(file, offset, offset + length))
            elif number == 15:
                _expect(wire, _LEN, "a sparse initializer")
                for inner, inner_wire, at, size in _fields(
                    file, offset, offset + length, "a sparse initializer"
                ):
                    if inner == 1:  # its values: a TensorProto holding the name
                        _expect(inner_wire, _LEN, "a sparse initializer's values")
                        self.initializers.add(_initializer(file, at, at + size))


def _initializer(file: _Source, start: int, end: int) -> str:
    name = ""
    for number, wire, value, length in _fields(file, start, end, "an initializer"):
        if number == 8:
            _expect(wire, _LEN, "an initializer's name")
            name = _string(file, value, length, "an initializer's name")
        elif (number == 14 and wire == _VARINT and value == 1) or number == 13:
            raise NotOnnx(
                f"its weight {name or '(unnamed)'!r} is stored outside the file (ONNX external "
                "data), which an upload cannot carry; save the model as one file "
                "(onnx.save_model(model, path, save_as_external_data=False), up to 2 GiB)"
            )
    return name


def _value_info(file: _Source, start: int, length: int, what: str) -> ModelValue:
    name, kind, shape = "", "unknown", None
    for number, wire, value, size in _fields(file, start, start + length, what):
        if number == 1:
            _expect(wire, _LEN, f"the name of {what}")
            name = _string(file, value, size, f"the name of {what}")
        elif number == 2:
            _expect(wire, _LEN, f"the type of {what}")
            kind, shape = _type(file, value, value + size, what, 0)
    if not name:
        raise NotOnnx(f"its graph's {what} has no name")
    return ModelValue(name=name, type=kind, shape=shape)


def _type(
    file: _Source, start: int, end: int, what: str, depth: int
) -> tuple[str, list[Dimension] | None]:
    """(type, shape) of a `TypeProto`: a tensor's element type, or the ONNX spelling of a
    sequence, map, optional or sparse tensor."""
    if depth > MAX_TYPE_DEPTH:
        raise NotOnnx(f"the type of its {what} nests more than {MAX_TYPE_DEPTH} levels")
    found: tuple[str, list[Dimension] | None] = ("unknown", None)
    for number, wire, value, length in _fields(file, start, end, f"the type of {what}"):
        if wire != _LEN:
            continue  # denotation and unknown scalars
        inner_end = value + length
        if number in (1, 8):  # tensor, sparse tensor
            element, shape = _tensor_type(file, value, inner_end, what)
            found = (element, shape) if number == 1 else (f"sparse_tensor({element})", shape)
        elif number in (4, 9):  # sequence, optional: one element type (field 1)
            inner = _nested(file, value, inner_end, what, depth)
            found = (f"{'sequence' if number == 4 else 'optional'}({inner})", None)
        elif number == 5:  # map: key_type (1, an element type), value_type (2, a type)
            key, mapped = "unknown", "unknown"
            for part, part_wire, at, size in _fields(file, value, inner_end, what):
                if part == 1 and part_wire == _VARINT:
                    key = _element(at)
                elif part == 2 and part_wire == _LEN:
                    mapped = _type(file, at, at + size, what, depth + 1)[0]
            found = (f"map({key},{mapped})", None)
        elif number == 7:
            found = ("opaque", None)
    return found


def _nested(file: _Source, start: int, end: int, what: str, depth: int) -> str:
    for number, wire, value, length in _fields(file, start, end, f"the type of {what}"):
        if number == 1 and wire == _LEN:
            return _type(file, value, value + length, what, depth + 1)[0]
    return "unknown"


def _tensor_type(
    file: _Source, start: int, end: int, what: str
) -> tuple[str, list[Dimension] | None]:
    element, shape = "undefined", None
    for number, wire, value, length in _fields(file, start, end, f"the type of {what}"):
        if number == 1 and wire == _VARINT:
            element = _element(value)
        elif number == 2 and wire == _LEN:
            shape = _shape(file, value, value + length, what)
    return element, shape


def _shape(file: _Source, start: int, end: int, what: str) -> list[Dimension]:
    dims: list[Dimension] = []
    for number, wire, value, length in _fields(file, start, end, f"the shape of {what}"):
        if number != 1 or wire != _LEN:
            continue
        if len(dims) >= MAX_RANK:
            raise NotOnnx(f"the shape of its {what} has more than {MAX_RANK} axes")
        dim: Dimension = None
        for part, part_wire, at, size in _fields(file, value, value + length, what):
            if part == 1 and part_wire == _VARINT:
                dim = at - (1 << 64) if at >= 1 << 63 else at  # int64, two's complement
            elif part == 2 and part_wire == _LEN:
                dim = _string(file, at, size, f"an axis name of {what}") or None
        dims.append(dim)
    return dims


def _element(code: int) -> str:
    return ELEMENT_TYPES.get(code, "undefined" if code == 0 else f"element type {code}")


def _string(file: _Source, start: int, length: int, what: str) -> str:
    if length > MAX_NAME_BYTES:
        raise NotOnnx(f"{what} is {length} bytes long; at most {MAX_NAME_BYTES}")
    file.seek(start)
    return file.read(length).decode("utf-8", errors="replace")


def _expect(wire: int, wanted: int, what: str) -> None:
    if wire != wanted:
        raise NotOnnx(f"its {what} is not encoded as ONNX encodes it (wire type {wire})")


def _fields(file: _Source, start: int, end: int, what: str) -> Iterator[Field]:
    """The fields of the message in `file[start:end]`, in order: (number, wire type, value,
    0) for numbers, (number, wire type, offset, length) for length-delimited payloads.
    The caller may read (seek) anywhere between two fields."""
    position = start
    while position < end:
        file.fields_left -= 1
        if file.fields_left < 0:
            raise NotOnnx(
                f"it holds more than {MAX_FIELDS} nodes, weights and values, more than an "
                "upload is read for"
            )
        tag, position = _varint(file, position, end, what)
        number, wire = tag >> 3, tag & 7
        if number == 0:
            raise _corrupt(what, position)
        if wire == _VARINT:
            value, position = _varint(file, position, end, what)
            yield number, wire, value, 0
        elif wire == _LEN:
            length, position = _varint(file, position, end, what)
            if position + length > end:
                raise _cut(what, position, length, end)
            yield number, wire, position, length
            position += length
        elif wire in _WIRE_SIZE:
            if position + _WIRE_SIZE[wire] > end:
                raise _cut(what, position, _WIRE_SIZE[wire], end)
            yield number, wire, position, _WIRE_SIZE[wire]
            position += _WIRE_SIZE[wire]
        else:  # groups (3, 4) are not used by ONNX; 6 and 7 do not exist
            raise _corrupt(what, position)


def _varint(file: _Source, position: int, end: int, what: str) -> tuple[int, int]:
    file.seek(position)
    data = file.read(min(10, end - position))
    value = 0
    for index, byte in enumerate(data):
        value |= (byte & 0x7F) << (7 * index)
        if not byte & 0x80:
            return value, position + index + 1
    raise _corrupt(what, position)


def _corrupt(what: str, position: int) -> NotOnnx:
    return NotOnnx(f"{what} is not protobuf as ONNX writes it (unreadable at byte {position})")


def _cut(what: str, position: int, length: int, end: int) -> NotOnnx:
    return NotOnnx(
        f"{what} ends before the {length} bytes a field at byte {position} declares "
        f"(it ends at byte {end}); the file is cut short or is not an ONNX model"
    )
