#!/usr/bin/env python3
"""Makes the hostile files of tests/cli/hostile_state_test.sh, one subcommand each.

  deep-json FILE DEPTH [KEY]      a JSON object whose KEY (default "x") holds DEPTH nested lists
  deep-into FILE KEY DEPTH        FILE (a JSON object) with KEY replaced by DEPTH nested lists
  set-json FILE KEY JSON_VALUE    FILE (a JSON object) with KEY set to the value
  big-list FILE KEY COUNT         FILE (a JSON object) with KEY set to a list of COUNT zeros
  state-ranges STATE BEGIN END    a node-local .state file whose header says its ranges are
                                  [[BEGIN, END]], re-checksummed (xxHash64) so that the header
                                  reads as intact: only its contents are wrong
  state-values STATE N            the same with "values": N and ranges [[0, N]], the file made
                                  (sparse) as long as that many values need: only the model
                                  its manifest describes says it cannot be
  safetensors-meta FILE JSON      FILE's "__metadata__" replaced (tensor data kept)
  safetensors-poison FILE NAME I  element I of the f32 tensor NAME set to NaN
  table-poison H5 VALUE           the first value of a stored DPO reference table set to VALUE
                                  (found as the first run of N doubles that all look like
                                  log-probabilities; N from the file's pair count)
  maxrss CMD...                   runs CMD, prints its peak resident memory in MiB on stderr and
                                  exits with its exit code
"""
import json
import os
import resource
import struct
import subprocess
import sys

M64 = (1 << 64) - 1
P1, P2, P3, P4, P5 = (11400714785074694791, 14029467366897019727, 1609587929392839161,
                      9650029242287828579, 2870177450012600261)


def rotl(x, r):
    return ((x << r) | (x >> (64 - r))) & M64


def xxh_round(acc, value):
    acc = (acc + value * P2) & M64
    return (rotl(acc, 31) * P1) & M64


def xxh_merge(acc, value):
    acc ^= xxh_round(0, value)
    return (acc * P1 + P4) & M64


def xxh64(data, seed=0):
    """XXH64 (the algorithm of the xxHash library the program links), for small buffers."""
    n, i = len(data), 0
    word = lambda at, size: int.from_bytes(data[at:at + size], "little")
    if n >= 32:
        v = [(seed + P1 + P2) & M64, (seed + P2) & M64, seed & M64, (seed - P1) & M64]
        while i + 32 <= n:
            v = [xxh_round(v[k], word(i + 8 * k, 8)) for k in range(4)]
            i += 32
        h = (rotl(v[0], 1) + rotl(v[1], 7) + rotl(v[2], 12) + rotl(v[3], 18)) & M64
        for k in range(4):
            h = xxh_merge(h, v[k])
    else:
        h = (seed + P5) & M64
    h = (h + n) & M64
    while i + 8 <= n:
        h ^= xxh_round(0, word(i, 8))
        h = (rotl(h, 27) * P1 + P4) & M64
        i += 8
    if i + 4 <= n:
        h ^= (word(i, 4) * P1) & M64
        h = (rotl(h, 23) * P2 + P3) & M64
        i += 4
    while i < n:
        h ^= (data[i] * P5) & M64
        h = (rotl(h, 11) * P1) & M64
        i += 1
    h ^= h >> 33
    h = (h * P2) & M64
    h ^= h >> 29
    h = (h * P3) & M64
    return h ^ (h >> 32)


def nested(depth):
    return "[" * depth + "]" * depth


def load(path):
    with open(path) as f:
        return json.load(f)


def deep_json(path, depth, key="x"):
    with open(path, "w") as f:
        f.write('{"%s": %s}' % (key, nested(int(depth))))


def deep_into(path, key, depth):
    text = json.dumps(dict(load(path), **{key: "@DEEP@"}))
    with open(path, "w") as f:
        f.write(text.replace('"@DEEP@"', nested(int(depth))))


def set_json(path, key, value):
    document = load(path)
    document[key] = json.loads(value)
    with open(path, "w") as f:
        json.dump(document, f)


def big_list(path, key, count):
    text = json.dumps(dict(load(path), **{key: "@BIG@"}))
    head, tail = text.split('"@BIG@"')
    with open(path, "w") as f:
        f.write(head + "[")
        chunk = ",".join(["0"] * 1000000)
        count = int(count)
        for written in range(0, count, 1000000):
            part = min(1000000, count - written)
            f.write((chunk if part == 1000000 else ",".join(["0"] * part)) + ("," if written + part < count else ""))
        f.write("]" + tail)


def edit_state_header(path, helper, edit, size=None):
    """Rewrites a node-local state file's JSON header with edit(document), its xxh64 recomputed,
    the data after it kept; size: the file's new length (sparse growth), if any."""
    with open(path, "rb") as f:
        data = f.read()
    magic, length, stored = data[:8], *struct.unpack("<QQ", data[8:24])
    header = data[24:24 + length]
    if xxh64(header) != stored:
        sys.exit(f"{helper}: the xxh64 here does not match the file's own (fix the helper)")
    document = json.loads(header)
    edit(document)
    new = json.dumps(document, separators=(",", ":")).encode()
    with open(path, "wb") as f:
        f.write(magic + struct.pack("<QQ", len(new), xxh64(new)) + new + data[24 + length:])
        if size is not None:
            f.truncate(size(len(new)))


def state_ranges(path, begin, end):
    edit_state_header(path, "state-ranges", lambda d: d.update(ranges=[[int(begin), int(end)]]))


def state_values(path, count):
    count = int(count)
    edit_state_header(path, "state-values", lambda d: d.update(values=count, ranges=[[0, count]]),
                      size=lambda header: 24 + header + 12 * count)  # sparse: three float arrays


def safetensors_parts(path):
    with open(path, "rb") as f:
        data = f.read()
    (length,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8:8 + length]), data[8 + length:]


def safetensors_write(path, header, payload):
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + payload)


def safetensors_meta(path, metadata):
    header, payload = safetensors_parts(path)
    header["__metadata__"] = json.loads(metadata)
    safetensors_write(path, header, payload)


def safetensors_poison(path, name, index):
    header, payload = safetensors_parts(path)
    begin = header[name]["data_offsets"][0] + 4 * int(index)
    payload = payload[:begin] + struct.pack("<I", 0x7FC00000) + payload[begin + 4:]
    safetensors_write(path, header, payload)


def table_poison(path, value, pairs):
    with open(path, "rb") as f:
        data = bytearray(f.read())
    pairs = int(pairs)
    for at in range(0, len(data) - 8 * pairs + 1):
        values = struct.unpack_from("<%dd" % pairs, data, at)
        if all(-1e5 < v < -1e-3 for v in values) and len(set(values)) > 1:
            struct.pack_into("<d", data, at, float(value))
            with open(path, "wb") as f:
                f.write(data)
            return
    sys.exit("table-poison: no run of %d log-probabilities found in %s" % (pairs, path))


def maxrss(command):
    code = subprocess.call(command)
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    print("maxrss_mib=%d" % (peak_kib // 1024), file=sys.stderr)
    sys.exit(code)


COMMANDS = {
    "deep-json": deep_json, "deep-into": deep_into, "set-json": set_json, "big-list": big_list,
    "state-ranges": state_ranges, "state-values": state_values, "safetensors-meta": safetensors_meta,
    "safetensors-poison": safetensors_poison, "table-poison": table_poison,
}

if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    if sys.argv[1] == "maxrss":
        maxrss(sys.argv[2:])
    COMMANDS[sys.argv[1]](*sys.argv[2:])
    os._exit(0)
