#!/usr/bin/env python3
"""Writes the hand-made seed corpora of tests/fuzz (run from anywhere; deterministic).

    make_seeds.py    rewrites tests/fuzz/{safetensors,probe_set,ipc_handle,score_request,verify_request}/corpus/seed-*

Good safetensors files come from the real `safetensors` package (the reference writer), edge cases
are written byte by byte. Score requests are serialized with the Python package's messages and
name what the fuzz target's fixed world holds (score_request_fuzz.cc): probe sets "p" (F32, P=3,
H=8) and "h" (BF16, P=2, H=16); session 1 with buffer 1 (4096 bytes), buffer 2 (1000 bytes at
offset 100 of the same allocation), buffer 3 (64 bytes) and events 1 and 2; session 2 with
buffer 4 (4096 bytes) and event 3.
Verify requests likewise name verify_request_fuzz.cc's world: session 1 with buffers 1 and 2
(4 MiB, the second from offset 16), buffers 3 and 4 (4 KiB, the second from offset 4) and events 1
and 2; session 2 with event 3.
buffer_registry's corpus is binary operation sequences, kept from fuzzing runs (`-merge=1`).
"""
import json
import pathlib
import struct

import numpy as np
from safetensors.numpy import save
from probesidecar.v1 import score_pb2, tensor_pb2, verify_pb2

HERE = pathlib.Path(__file__).resolve().parent


def write(target, name, data):
    corpus = HERE / target / "corpus"
    corpus.mkdir(parents=True, exist_ok=True)
    (corpus / f"seed-{name}").write_bytes(data)


def raw_file(header, data=b""):
    header = header.encode() if isinstance(header, str) else header
    return struct.pack("<Q", len(header)) + header + data


def sorted_metadata(data):
    """The reference writer orders metadata keys by a hash map: sort them, so seeds are stable."""
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    if "__metadata__" in header:
        header["__metadata__"] = dict(sorted(header["__metadata__"].items()))
    text = json.dumps(header, separators=(",", ":"))
    text += " " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text.encode() + data[8 + n:]


def probe_file(dtype, p, h, metadata=None):
    rng = np.random.default_rng(p * 100 + h)
    weight = rng.standard_normal((p, h)).astype(dtype)
    bias = rng.standard_normal(p).astype(dtype)
    return sorted_metadata(save({"weight": weight, "bias": bias}, metadata=metadata))


def safetensors_seeds():
    files = {
        "f32-f16-u8": save({"a": np.arange(6, dtype=np.float32).reshape(2, 3),
                            "b": np.ones(3, dtype=np.float16), "c": np.arange(5, dtype=np.uint8)}),
        "i64-i32-bool": save({"x": np.arange(2, dtype=np.int64), "y": np.arange(3, dtype=np.int32),
                              "z": np.array([True, False])}, metadata={"format": "pt"}),
        "scalar-and-empty": save({"s": np.array(1.5, dtype=np.float64),
                                  "e": np.zeros((0, 4), dtype=np.float32)}),
        "no-tensors": raw_file("{}"),
        "metadata-only": raw_file('{"__metadata__":{"k":"v","\\u00e9":"\\u0000"}}'),
        "padded-header": raw_file('{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}      ',
                                  b"\x01\x02"),
        "rank-8": raw_file('{"a":{"dtype":"I8","shape":[1,1,1,1,1,1,1,2],"data_offsets":[0,2]}}',
                           b"\x01\x02"),
        "zero-size-between": raw_file(
            '{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
            '"b":{"dtype":"F32","shape":[0],"data_offsets":[1,1]},'
            '"c":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}', b"\x01\x02"),
        "overlap": raw_file('{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},'
                            '"b":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}}', b"abc"),
        "misaligned": raw_file('{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
                               '"b":{"dtype":"F32","shape":[1],"data_offsets":[1,5]}}', b"xyzwv"),
        "huge-shape": raw_file('{"a":{"dtype":"F64","shape":[4294967296,4294967296],'
                               '"data_offsets":[0,0]}}'),
        "deep": raw_file('{"__metadata__":' + "[" * 9 + "]" * 9 + "}"),
        "duplicate-key": raw_file('{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
                                  '"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"x"),
        "length-past-end": struct.pack("<Q", 1 << 40) + b"{}",
    }
    for name, data in files.items():
        write("safetensors", name, data)


def probe_set_seeds():
    files = {
        "f32": probe_file(np.float32, 3, 8),
        "f16-sigmoid": probe_file(np.float16, 2, 4, {"activation": "sigmoid",
                                                     "probe_names": '["toxic", "pii"]'}),
        "thresholds": probe_file(np.float32, 3, 2, {"thresholds": "[0.5, null, -1e3]",
                                                    "probe_names": '["a", "b", "c"]',
                                                    "format": "pt"}),
        "nan-weight": save({"weight": np.array([[np.nan]], dtype=np.float32),
                            "bias": np.zeros(1, dtype=np.float32)}),
        "bad-names": probe_file(np.float32, 2, 2, {"probe_names": '["a", "a"]'}),
        "nested-thresholds": probe_file(np.float32, 1, 2, {"thresholds": "[[1]]"}),
        "extra-tensor": save({"weight": np.zeros((1, 2), dtype=np.float32),
                              "bias": np.zeros(1, dtype=np.float32),
                              "other": np.zeros(1, dtype=np.float32)}),
    }
    # bf16 bits: numpy has no bf16, so write uint16 bits and relabel the dtype in the header.
    bf16 = save({"weight": np.full((2, 3), 0x3f80, dtype=np.uint16),
                 "bias": np.zeros(2, dtype=np.uint16)})
    n = struct.unpack("<Q", bf16[:8])[0]
    header = bf16[8:8 + n].replace(b'"U16"', b'"BF16"')
    files["bf16"] = struct.pack("<Q", len(header)) + header + bf16[8 + n:]
    for name, data in files.items():
        write("probe_set", name, data)


def ipc_handle_seeds():
    raw = bytes(range(1, 65))
    seeds = {
        "raw-64": raw,
        "torch-66": b"\x02c" + raw,
        "torch-expandable-30": b"\x02e" + bytes(range(1, 29)),
        "torch-version-1": b"\x01c" + raw,
        "all-zero-64": bytes(64),
        "short": b"\x02",
    }
    for name, data in seeds.items():
        write("ipc_handle", name, data)


def tensor(dtype, shape, data=None, buffer=None, row_stride=0):
    t = tensor_pb2.TensorRef(dtype=dtype, shape=shape, row_stride=row_stride)
    if buffer is not None:
        t.buffer.buffer_id, t.buffer.offset_bytes = buffer
    elif data is not None:
        t.data = data
    return t


def score_request_seeds():
    F32, F16, BF16, I32 = (tensor_pb2.DTYPE_FLOAT32, tensor_pb2.DTYPE_FLOAT16,
                           tensor_pb2.DTYPE_BFLOAT16, tensor_pb2.DTYPE_INT32)
    R = score_pb2.ScoreRequest
    requests = {
        "inline-f32": R(probe_set="p", rows=[3, 0],
                        activations=tensor(F32, [4, 8], np.ones(32, np.float32).tobytes())),
        "inline-bf16": R(probe_set="h", rows=[1],
                         activations=tensor(BF16, [2, 16], bytes(64))),
        "inline-f16-strided": R(probe_set="p", rows=[2, 2, 0],
                                activations=tensor(F16, [3, 8], bytes((2 * 10 + 8) * 2),
                                                   row_stride=10)),
        "buffer": R(probe_set="p", rows=[0, 3], session_id=1,
                    activations=tensor(F32, [4, 8], buffer=(1, 0))),
        "buffer-window": R(probe_set="h", rows=[0], session_id=1,
                           activations=tensor(BF16, [4, 16], buffer=(2, 4), row_stride=20)),
        "buffer-output": R(probe_set="p", rows=[1, 2], session_id=1,
                           activations=tensor(F32, [4, 8], buffer=(1, 0)),
                           output=tensor(F32, [2, 3], buffer=(3, 0))),
        "device-rows": R(probe_set="p", session_id=1,
                         activations=tensor(F32, [4, 8], buffer=(1, 256)),
                         device_rows=tensor(I32, [2], buffer=(2, 0))),
        "events": R(probe_set="p", rows=[0], session_id=1, ready_event=1, done_event=2,
                    activations=tensor(F32, [4, 8], buffer=(1, 0))),
        "foreign-event": R(probe_set="p", rows=[0], session_id=1, ready_event=3,
                           activations=tensor(F32, [4, 8], buffer=(1, 0))),
        "foreign-buffer": R(probe_set="p", rows=[0], session_id=2,
                            activations=tensor(F32, [4, 8], buffer=(1, 0))),
        "other-session": R(probe_set="p", rows=[0], session_id=2,
                           activations=tensor(F32, [4, 8], buffer=(4, 64))),
        "misaligned": R(probe_set="p", rows=[0], session_id=1,
                        activations=tensor(F32, [1, 8], buffer=(2, 2))),
        "huge-stride": R(probe_set="p", rows=[0],
                         activations=tensor(F32, [1, 8], bytes(4000), row_stride=1 << 62)),
        "unknown-set": R(probe_set="nope", rows=[0],
                         activations=tensor(F32, [1, 8], bytes(32))),
    }
    for name, request in requests.items():
        write("score_request", name, request.SerializeToString())


def verify_request_seeds():
    BF16, F32, I32 = tensor_pb2.DTYPE_BFLOAT16, tensor_pb2.DTYPE_FLOAT32, tensor_pb2.DTYPE_INT32
    i32 = lambda values: np.array(values, dtype=np.int32).tobytes()

    def good(**changes):
        r = verify_pb2.VerifyRequest(
            q=tensor(BF16, [2, 1, 16, 576], buffer=(1, 0)),
            kv_cache=tensor(BF16, [3, 64, 576], buffer=(1, 1 << 20)),
            block_table=tensor(I32, [2, 2], i32([0, 2, 1, 0])),
            cache_seqlens=tensor(I32, [2], i32([70, 1])),
            softmax_scale=0.0416, session_id=1,
            out=tensor(BF16, [2, 1, 16, 512], buffer=(2, 0)),
            lse=tensor(F32, [2, 16, 1], buffer=(3, 0)))
        for field, value in changes.items():
            if value is None:
                r.ClearField(field)
            elif isinstance(value, tensor_pb2.TensorRef):
                getattr(r, field).CopyFrom(value)
            else:
                setattr(r, field, value)
        return r

    requests = {
        "inline-tables": good(),
        "device-tables": good(block_table=tensor(I32, [2, 2], buffer=(3, 512)),
                              cache_seqlens=tensor(I32, [2], buffer=(4, 0))),
        "strided": good(q=tensor(BF16, [2, 2, 16, 576], buffer=(1, 0), row_stride=2 * 16 * 576 + 8),
                        out=tensor(BF16, [2, 2, 16, 512], buffer=(2, 0), row_stride=2 * 16 * 512 + 64),
                        lse=tensor(F32, [2, 16, 2], buffer=(3, 0), row_stride=40),
                        cache_seqlens=tensor(I32, [2], i32([70, 2]))),
        "shadow": good(out=None, lse=None, shadow_atol=0.01,
                       compare_to=tensor(BF16, [2, 1, 16, 512], buffer=(2, 1 << 21))),
        "events": good(session_id=1, ready_event=1, done_event=2),
        "foreign-event": good(ready_event=3),
        "foreign-buffers": good(session_id=2),
        "misaligned-q": good(q=tensor(BF16, [2, 1, 16, 576], buffer=(2, 2))),
        "page-past-cache": good(block_table=tensor(I32, [2, 2], i32([0, 3, 1, 0]))),
        "length-past-table": good(cache_seqlens=tensor(I32, [2], i32([129, 1]))),
        "kv-past-buffer": good(kv_cache=tensor(BF16, [100, 64, 576], buffer=(1, 0))),
    }
    for name, request in requests.items():
        write("verify_request", name, request.SerializeToString())


if __name__ == "__main__":
    safetensors_seeds()
    probe_set_seeds()
    ipc_handle_seeds()
    score_request_seeds()
    verify_request_seeds()
