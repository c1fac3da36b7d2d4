#!/usr/bin/env python3
"""Reads TensorBoard event files without TensorFlow or loom: the TFRecord
framing (length, masked CRC-32C of the length, data, masked CRC-32C of the
data) and the Event / Summary protobufs, parsed by hand from their wire
format. Written independently of core/summary_writer.cpp, to check it.

  read_tfevents.py FILE...            prints "tag step value" per scalar
  read_tfevents.py --expect TAG ... FILE   fails unless every TAG has scalars
Exits 1 with the reason on a framing, CRC or protobuf error."""
import struct
import sys


def crc32c(data):
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF


def masked(data):
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def fields(message):
    """(field number, wire type, value) of a protobuf message."""
    at = 0

    def varint():
        nonlocal at
        shift = value = 0
        while True:
            if at >= len(message):
                raise ValueError("varint runs past the message")
            byte = message[at]
            at += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                return value

    while at < len(message):
        key = varint()
        number, wire = key >> 3, key & 7
        if wire == 0:
            yield number, wire, varint()
        elif wire == 1:
            yield number, wire, message[at:at + 8]
            at += 8
        elif wire == 2:
            length = varint()
            if at + length > len(message):
                raise ValueError(f"field {number}: length {length} runs past the message")
            yield number, wire, message[at:at + length]
            at += length
        elif wire == 5:
            yield number, wire, message[at:at + 4]
            at += 4
        else:
            raise ValueError(f"field {number}: wire type {wire} is not used by Event")


def read_events(path):
    """The file's events as dicts: wall_time, step, and file_version or scalars [(tag, value)]."""
    data = open(path, "rb").read()
    events, at = [], 0
    while at < len(data):
        if at + 12 > len(data):
            raise ValueError(f"{path}: truncated record header at byte {at}")
        header = data[at:at + 8]
        (length,) = struct.unpack("<Q", header)
        (length_crc,) = struct.unpack("<I", data[at + 8:at + 12])
        if length_crc != masked(header):
            raise ValueError(f"{path}: bad length CRC at byte {at}")
        body = data[at + 12:at + 12 + length]
        if len(body) != length or at + 16 + length > len(data):
            raise ValueError(f"{path}: truncated record at byte {at}")
        (body_crc,) = struct.unpack("<I", data[at + 12 + length:at + 16 + length])
        if body_crc != masked(body):
            raise ValueError(f"{path}: bad data CRC at byte {at}")
        at += 16 + length
        event = {"wall_time": 0.0, "step": 0, "scalars": []}
        for number, wire, value in fields(body):
            if number == 1 and wire == 1:
                (event["wall_time"],) = struct.unpack("<d", value)
            elif number == 2 and wire == 0:
                event["step"] = value - (1 << 64) if value >= 1 << 63 else value
            elif number == 3 and wire == 2:
                event["file_version"] = value.decode()
            elif number == 5 and wire == 2:
                for summary_field, summary_wire, item in fields(value):
                    if summary_field != 1 or summary_wire != 2:
                        continue
                    tag, scalar = None, None
                    for value_field, value_wire, part in fields(item):
                        if value_field == 1 and value_wire == 2:
                            tag = part.decode()
                        elif value_field == 2 and value_wire == 5:
                            (scalar,) = struct.unpack("<f", part)
                    if tag is None or scalar is None:
                        raise ValueError(f"{path}: a summary value without tag or simple_value")
                    event["scalars"].append((tag, scalar))
        events.append(event)
    if not events or events[0].get("file_version") != "brain.Event:2":
        raise ValueError(f"{path}: the first record is not file_version brain.Event:2")
    return events


def main(argv):
    expect = []
    while argv and argv[0] == "--expect":
        expect.append(argv[1])
        argv = argv[2:]
    seen = set()
    try:
        for path in argv:
            for event in read_events(path):
                for tag, value in event["scalars"]:
                    seen.add(tag)
                    print(tag, event["step"], value)
    except (OSError, ValueError) as error:
        print(f"read_tfevents: {error}", file=sys.stderr)
        return 1
    missing = [tag for tag in expect if tag not in seen]
    if missing:
        print(f"read_tfevents: no scalars for {', '.join(missing)} (seen: {', '.join(sorted(seen))})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
