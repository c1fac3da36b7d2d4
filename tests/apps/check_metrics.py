#!/usr/bin/env python3
"""Checks a --metrics file against the schema of docs/metrics.md, written
from that document (not from the writer): every line one JSON object, a
header first, the fields each record type must and may carry with their
types and ranges, and the records' order.

  check_metrics.py FILE [--world N] [--steps-between K] [--epochs E] [--amp-scaler]
Prints a summary; exits 1 naming the line and the field on the first error."""
import argparse
import json
import math
import sys

NUMBER, INTEGER, STRING, STRINGS, NULLABLE_NUMBER = "number", "integer", "string", "strings", "number or null"

HEADER = {"type": STRING, "time": NUMBER, "program": STRING, "command": STRINGS, "loom_version": STRING,
          "world_size": INTEGER, "backend": STRING, "device": STRING, "amp": STRING, "dtype": STRING,
          "global_batch_size": INTEGER, "epochs": INTEGER, "steps_per_epoch": INTEGER, "log_interval": INTEGER}
RATES = {"images_per_s": NUMBER, "data_wait_s": NUMBER, "data_wait_share": NUMBER, "step_time_ms": NUMBER,
         "peak_host_rss_bytes": INTEGER, "peak_gpu_bytes": INTEGER, "lr": NUMBER, "loss": NULLABLE_NUMBER,
         "time": NUMBER, "elapsed_s": NUMBER, "type": STRING, "epoch": INTEGER, "step": INTEGER}
STEP = dict(RATES, epoch_step=INTEGER)
EPOCH = dict(RATES, epoch_steps=INTEGER, epoch_time_s=NUMBER, images=INTEGER, test_accuracy=NULLABLE_NUMBER)
DDP = {"comm_ms": NUMBER, "comm_hidden_share": NUMBER, "exposed_comm_ms": NUMBER}
SCALER = {"loss_scale": NUMBER, "skipped_steps": INTEGER}
TEST_COUNTS = {"test_correct": INTEGER, "test_total": INTEGER}


def type_ok(value, kind):
    if kind == INTEGER:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == NUMBER:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if kind == NULLABLE_NUMBER:
        return value is None or type_ok(value, NUMBER)
    if kind == STRING:
        return isinstance(value, str) and value != ""
    if kind == STRINGS:
        return isinstance(value, list) and value and all(isinstance(v, str) for v in value)
    raise AssertionError(kind)


class Failure(Exception):
    pass


def check_fields(where, record, required, optional):
    for name, kind in required.items():
        if name not in record:
            raise Failure(f"{where}: no field '{name}'")
        if not type_ok(record[name], kind):
            raise Failure(f"{where}: '{name}' is {record[name]!r}, expected a {kind}")
    for name, value in record.items():
        if name in required:
            continue
        if name not in optional:
            raise Failure(f"{where}: field '{name}' is not in the schema")
        if not type_ok(value, optional[name]):
            raise Failure(f"{where}: '{name}' is {value!r}, expected a {optional[name]}")


def check_ranges(where, record):
    for share in ("data_wait_share", "comm_hidden_share", "test_accuracy"):
        value = record.get(share)
        if value is not None and not 0 <= value <= 1:
            raise Failure(f"{where}: '{share}' is {value}, outside 0..1")
    for name in ("images_per_s", "data_wait_s", "step_time_ms", "comm_ms", "exposed_comm_ms", "lr",
                 "peak_host_rss_bytes", "peak_gpu_bytes", "epoch_time_s", "elapsed_s", "images"):
        if name in record and record[name] < 0:
            raise Failure(f"{where}: '{name}' is negative")
    if record["type"] != "header" and record["epoch"] < 1:
        raise Failure(f"{where}: epochs are 1-based")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("file")
    parser.add_argument("--world", type=int, default=1)
    parser.add_argument("--steps-between", type=int, help="expected log interval between step records")
    parser.add_argument("--epochs", type=int, help="expected epoch records")
    parser.add_argument("--amp-scaler", action="store_true", help="records must carry loss_scale")
    args = parser.parse_args()
    counts = {"header": 0, "step": 0, "epoch": 0}
    try:
        lines = open(args.file).read().splitlines()
        if not lines:
            raise Failure(f"{args.file} is empty")
        header, previous_step = None, None
        for number, line in enumerate(lines, 1):
            where = f"{args.file}:{number}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise Failure(f"{where}: not JSON: {error}")
            if not isinstance(record, dict) or record.get("type") not in counts:
                raise Failure(f"{where}: not a record with type header, step or epoch")
            kind = record["type"]
            counts[kind] += 1
            if number == 1 and kind != "header":
                raise Failure(f"{where}: the first record must be the header")
            if kind == "header":
                check_fields(where, record, HEADER, {})
                if record["world_size"] != args.world:
                    raise Failure(f"{where}: world_size {record['world_size']}, expected {args.world}")
                if (record["backend"] == "none") != (args.world == 1):
                    raise Failure(f"{where}: backend {record['backend']} for world {args.world}")
                header, previous_step = record, None
                continue
            required = dict(STEP if kind == "step" else EPOCH)
            optional = dict(TEST_COUNTS) if kind == "epoch" else {}
            if args.world > 1:
                required.update(DDP)
            if args.amp_scaler:
                required.update(SCALER)
            if kind == "epoch" and record.get("test_accuracy") is not None:
                required.update(TEST_COUNTS)
            check_fields(where, record, required, optional)
            check_ranges(where, record)
            if kind == "step":
                if record["epoch_step"] % header["log_interval"] != 0:
                    raise Failure(f"{where}: epoch_step {record['epoch_step']} is not a multiple of the log interval")
                if args.steps_between and previous_step is not None and \
                        record["step"] - previous_step not in (args.steps_between, 0) and \
                        record["epoch_step"] != args.steps_between:
                    raise Failure(f"{where}: step {record['step']} after {previous_step}")
                if header["device"] == "cpu" and record["peak_gpu_bytes"] != 0:
                    raise Failure(f"{where}: peak_gpu_bytes on the CPU")
                previous_step = record["step"]
            if kind == "epoch" and record["test_accuracy"] is not None:
                if record["test_total"] <= 0 or \
                        abs(record["test_accuracy"] - record["test_correct"] / record["test_total"]) > 1e-6:
                    raise Failure(f"{where}: test_accuracy is not test_correct / test_total")
        if counts["step"] == 0:
            raise Failure(f"{args.file}: no step records")
        if args.epochs is not None and counts["epoch"] != args.epochs:
            raise Failure(f"{args.file}: {counts['epoch']} epoch records, expected {args.epochs}")
    except (OSError, Failure) as error:
        print(f"check_metrics: {error}", file=sys.stderr)
        return 1
    print(f"ok: {args.file}: {counts['header']} header, {counts['step']} step and {counts['epoch']} epoch records")
    return 0


if __name__ == "__main__":
    sys.exit(main())
