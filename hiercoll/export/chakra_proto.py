"""Chakra's execution-trace messages (mlcommons/chakra, schema/protobuf/et_def.proto, package
ChakraProtoMsg), built at run time from a descriptor written here, so no protoc and no generated
file: only `protobuf` (`pip install 'hiercoll[export]'`).

Only what hiercoll writes is declared: GlobalMetadata, Node, IOInfo, AttributeProto (the oneof
members used), NodeType and CollectiveCommType. Field numbers and types are the published
ones, so the bytes are what Chakra's own classes read (unknown fields and members stay absent).
A trace file is a stream of messages, each prefixed by its length as a varint (Chakra's
protolib.encodeMessage): the GlobalMetadata first, then the nodes."""

from __future__ import annotations

import functools
from typing import Any

from hiercoll.errors import HiercollError

PACKAGE = "ChakraProtoMsg"
NODE_TYPES = {"INVALID_NODE": 0, "METADATA_NODE": 1, "MEM_LOAD_NODE": 2, "MEM_STORE_NODE": 3,
              "COMP_NODE": 4, "COMM_SEND_NODE": 5, "COMM_RECV_NODE": 6, "COMM_COLL_NODE": 7}
COLLECTIVE_COMM_TYPES = {"ALL_REDUCE": 0, "REDUCE": 1, "ALL_GATHER": 2, "GATHER": 3, "SCATTER": 4,
                         "BROADCAST": 5, "ALL_TO_ALL": 6, "REDUCE_SCATTER": 7,
                         "REDUCE_SCATTER_BLOCK": 8, "BARRIER": 9}
# AttributeProto's oneof `value`: (name, number, type) for the members hiercoll uses
ATTR_MEMBERS = (("double_val", 3, "double"), ("int32_val", 7, "int32"), ("int64_val", 9, "int64"),
                ("uint32_val", 11, "uint32"), ("uint64_val", 13, "uint64"), ("bool_val", 27, "bool"),
                ("string_val", 29, "string"))


def _protobuf() -> Any:
    try:
        from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    except ImportError:
        raise HiercollError("export chakra: needs the protobuf package; pip install "
                            "'hiercoll[export]' (or: pip install protobuf)") from None
    return descriptor_pb2, descriptor_pool, message_factory


@functools.cache
def messages() -> dict[str, Any]:
    """Message classes by name: GlobalMetadata, Node, IOInfo, AttributeProto."""
    descriptor_pb2, descriptor_pool, message_factory = _protobuf()
    F = descriptor_pb2.FieldDescriptorProto
    scalar = {"double": F.TYPE_DOUBLE, "int32": F.TYPE_INT32, "int64": F.TYPE_INT64,
              "uint32": F.TYPE_UINT32, "uint64": F.TYPE_UINT64, "bool": F.TYPE_BOOL,
              "string": F.TYPE_STRING}
    fdp = descriptor_pb2.FileDescriptorProto(name="hiercoll_et_def.proto", package=PACKAGE, syntax="proto3")

    def enum(name: str, values: dict[str, int]) -> None:
        e = fdp.enum_type.add(name=name)
        for k, v in values.items():
            e.value.add(name=k, number=v)

    def message(name: str, fields: list[tuple[str, int, str, bool]]) -> Any:
        m = fdp.message_type.add(name=name)
        for fname, number, ftype, repeated in fields:
            f = m.field.add(name=fname, number=number,
                            label=F.LABEL_REPEATED if repeated else F.LABEL_OPTIONAL)
            if ftype in scalar:
                f.type = scalar[ftype]
            elif ftype == "NodeType":
                f.type, f.type_name = F.TYPE_ENUM, f".{PACKAGE}.NodeType"
            else:
                f.type, f.type_name = F.TYPE_MESSAGE, f".{PACKAGE}.{ftype}"
        return m

    enum("NodeType", NODE_TYPES)
    enum("CollectiveCommType", COLLECTIVE_COMM_TYPES)
    attr = message("AttributeProto", [("name", 1, "string", False), ("doc_string", 2, "string", False)]
                   + [(n, num, t, False) for n, num, t in ATTR_MEMBERS])
    attr.oneof_decl.add(name="value")
    for f in attr.field[2:]:
        f.oneof_index = 0
    message("GlobalMetadata", [("version", 1, "string", False), ("attr", 2, "AttributeProto", True)])
    message("IOInfo", [("values", 1, "string", False), ("shapes", 2, "string", False),
                       ("types", 3, "string", False)])
    message("Node", [("id", 1, "uint64", False), ("name", 2, "string", False), ("type", 3, "NodeType", False),
                     ("ctrl_deps", 4, "uint64", True), ("data_deps", 5, "uint64", True),
                     ("start_time_micros", 6, "uint64", False), ("duration_micros", 7, "uint64", False),
                     ("inputs", 8, "IOInfo", False), ("outputs", 9, "IOInfo", False),
                     ("attr", 10, "AttributeProto", True)])
    pool = descriptor_pool.DescriptorPool()      # private: never clashes with chakra's own classes
    pool.Add(fdp)
    get = getattr(message_factory, "GetMessageClass", None)
    out = {}
    for name in ("AttributeProto", "GlobalMetadata", "IOInfo", "Node"):
        desc = pool.FindMessageTypeByName(f"{PACKAGE}.{name}")
        out[name] = get(desc) if get else message_factory.MessageFactory(pool).GetPrototype(desc)
    return out


def encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        bits, value = value & 0x7F, value >> 7
        out.append(bits | (0x80 if value else 0))
        if not value:
            return bytes(out)


def encode_stream(msgs: list[Any]) -> bytes:
    """Length-delimited messages, as Chakra's protolib.encodeMessage writes them."""
    parts = []
    for m in msgs:
        body = m.SerializeToString()
        parts += [encode_varint(len(body)), body]
    return b"".join(parts)


def decode_stream(data: bytes) -> tuple[Any, list[Any]]:
    """(GlobalMetadata, nodes) of one trace file: the inverse of encode_stream."""
    cls = messages()
    pos, items = 0, []
    while pos < len(data):
        size = shift = 0
        while True:
            if pos >= len(data):
                raise HiercollError("chakra trace: truncated length prefix")
            b = data[pos]
            pos += 1
            size |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                break
        if pos + size > len(data):
            raise HiercollError("chakra trace: truncated message")
        items.append(data[pos:pos + size])
        pos += size
    if not items:
        raise HiercollError("chakra trace: empty file")
    meta = cls["GlobalMetadata"].FromString(items[0])
    return meta, [cls["Node"].FromString(b) for b in items[1:]]
