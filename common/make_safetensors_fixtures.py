#!/usr/bin/env python3
"""Writes safetensors files with the real Python `safetensors` package for the C++ tests.

usage: make_safetensors_fixtures.py OUTDIR [--demo-bin PATH/TO/make-demo-probe-set]

OUTDIR receives:
  *.safetensors   files written by safetensors (numpy API; bf16 through TensorSpec, since numpy
                  has no bfloat16 and torch is not needed)
  manifest.json   for every file: its metadata and, per tensor, dtype, shape, the raw bytes (hex)
                  and, for float dtypes, the exact float32/float64 values; the C++ tests check
                  their reader against it and check that WriteSafetensors reproduces each file
                  byte for byte
With --demo-bin the C++ writer is checked the other way round: make-demo-probe-set runs twice
(the outputs must be byte-identical), and safetensors itself must read the result with the
expected header, metadata and value statistics. The file is left as OUTDIR/demo.safetensors.

Needs numpy and safetensors (the build's Python3_EXECUTABLE is a venv with both). Exits non-zero
with a message on any failure.
"""

import argparse
import json
import os
import subprocess
import sys

try:
    import numpy as np
    import safetensors
    from safetensors import deserialize, safe_open, serialize_file
    from safetensors.numpy import load_file, save_file
except ImportError as e:  # pragma: no cover - a setup problem, reported plainly
    sys.exit(f"make_safetensors_fixtures.py needs numpy and safetensors: {e}")
try:
    from safetensors import TensorSpec  # safetensors >= 0.7
except ImportError:
    TensorSpec = None  # older versions take {"dtype", "shape", "data"} dicts


def bf16(values):
    """float32 values rounded to bfloat16 (nearest even), as the raw uint16 bits."""
    bits = np.asarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def bf16_to_float32(bits):
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def spec(array, dtype=None):
    """What safetensors.serialize takes for a contiguous little-endian array (which the caller
    keeps alive): a TensorSpec, or the dict that versions before 0.7 take."""
    dtype = dtype or array.dtype.name
    if TensorSpec is None:
        return {"dtype": dtype, "shape": list(array.shape), "data": array.tobytes()}
    return TensorSpec(
        dtype=dtype, shape=list(array.shape), data_ptr=array.ctypes.data, data_len=array.nbytes
    )


class Fixtures:
    def __init__(self, outdir):
        self.outdir = outdir
        self.manifest = {"safetensors_version": safetensors.__version__, "files": {}}

    def _record(self, filename, tensors, metadata):
        entry = {"metadata": metadata or {}, "tensors": {}}
        for name, (array, st_dtype) in tensors.items():
            array = np.require(array, requirements="C")  # keeps 0-d arrays 0-d
            info = {"dtype": st_dtype, "shape": list(array.shape), "hex": array.tobytes().hex()}
            if st_dtype == "BF16":
                info["values"] = [float(v) for v in bf16_to_float32(array).ravel()]
            elif st_dtype in ("F16", "F32", "F64"):
                info["values"] = [float(v) for v in array.astype(np.float64).ravel()]
            entry["tensors"][name] = info
        self.manifest["files"][filename] = entry

    def save_numpy(self, filename, arrays, metadata=None):
        """The plain numpy API: safetensors.numpy.save_file."""
        path = os.path.join(self.outdir, filename)
        save_file(arrays, path, metadata=metadata)
        dtypes = {
            "float64": "F64", "float32": "F32", "float16": "F16", "int64": "I64",
            "int32": "I32", "int16": "I16", "int8": "I8", "uint64": "U64", "uint32": "U32",
            "uint16": "U16", "uint8": "U8", "bool": "BOOL",
        }
        self._record(filename, {k: (v, dtypes[v.dtype.name]) for k, v in arrays.items()},
                     metadata)
        # Read back through the public API as a sanity check of the fixture itself.
        loaded = load_file(path)
        for k, v in arrays.items():
            assert loaded[k].dtype == v.dtype and np.array_equal(loaded[k], v), (filename, k)

    def save_specs(self, filename, tensors, metadata=None):
        """tensors: name -> (array, safetensors dtype); BF16 arrays hold raw uint16 bits."""
        path = os.path.join(self.outdir, filename)
        alive = {k: np.require(a, requirements="C") for k, (a, _) in tensors.items()}
        serialize_file(
            {k: spec(alive[k], "bfloat16" if d == "BF16" else None) for k, (_, d) in
             tensors.items()},
            path,
            metadata=metadata,
        )
        self._record(filename, {k: (alive[k], d) for k, (_, d) in tensors.items()}, metadata)
        with open(path, "rb") as f:
            back = dict(deserialize(f.read()))
        for k, (array, dtype) in tensors.items():
            assert back[k]["dtype"] == dtype, (filename, k, back[k]["dtype"])
            assert bytes(back[k]["data"]) == alive[k].tobytes(), (filename, k)

    def write_manifest(self):
        with open(os.path.join(self.outdir, "manifest.json"), "w") as f:
            json.dump(self.manifest, f, indent=1, sort_keys=True)


def make_fixtures(fx):
    rng = np.random.default_rng(20261129)

    # Generic files for the reader.
    fx.save_numpy(
        "st_multi_dtype.safetensors",
        {
            "f64": rng.standard_normal((2, 3)),
            "f32": rng.standard_normal(5).astype(np.float32),
            "f16": rng.standard_normal((3, 1)).astype(np.float16),
            "i64": np.array([-(2**62), 2**62 - 1], dtype=np.int64),
            "i32": np.arange(-4, 4, dtype=np.int32).reshape(2, 2, 2),
            "i16": np.array([-300, 7], dtype=np.int16),
            "i8": np.array([-128, 0, 127], dtype=np.int8),
            "u64": np.array([2**64 - 1], dtype=np.uint64),
            "u32": np.array([7, 8, 9], dtype=np.uint32),
            "u16": np.array([65535], dtype=np.uint16),
            "u8": np.arange(5, dtype=np.uint8),
            "flags": np.array([True, False, True], dtype=np.bool_),
            "scalar": np.array(3.5, dtype=np.float32),
            "empty": np.zeros((0, 3), dtype=np.float32),
        },
        metadata={"format": "pt"},
    )
    fx.save_numpy("st_no_metadata.safetensors",
                  {"x": np.arange(6, dtype=np.float32).reshape(2, 3)})
    fx.save_numpy(
        "st_unicode.safetensors",
        {
            "gr\u00fc\u00dfe.weight": np.ones(2, dtype=np.float32),
            'quote"back\\slash': np.array([1], dtype=np.int8),
        },
        metadata={"note": 'line1\nline2\ttab "q" \u00e9\u20ac\U0001f600 \x01'},
    )
    fx.save_specs(
        "st_bf16_mixed.safetensors",
        {
            "a_bf16": (bf16(rng.standard_normal((3, 4))), "BF16"),
            "b_f32": (rng.standard_normal(3).astype(np.float32), "F32"),
            "c_u8": (np.arange(3, dtype=np.uint8), "U8"),
        },
        metadata={"format": "pt"},
    )
    fx.save_specs("st_no_tensors.safetensors", {})

    # Probe sets.
    fx.save_numpy(
        "probe_fp32.safetensors",
        {
            "weight": rng.standard_normal((3, 8)).astype(np.float32),
            "bias": rng.standard_normal(3).astype(np.float32),
        },
        metadata={
            "probe_names": json.dumps(["toxicity", "refusal", "pii"]),
            "activation": "sigmoid",
            "thresholds": json.dumps([0.25, None, -1.5]),
        },
    )
    fx.save_numpy(
        "probe_fp16.safetensors",
        {
            "weight": rng.standard_normal((2, 16)).astype(np.float16),
            "bias": rng.standard_normal(2).astype(np.float32),
        },
        metadata={"probe_names": json.dumps(["alpha", "beta"]), "activation": "none"},
    )
    fx.save_specs(
        "probe_bf16.safetensors",
        {
            "weight": (bf16(rng.standard_normal((4, 32)) / 8), "BF16"),
            "bias": (bf16(rng.standard_normal(4) / 100), "BF16"),
        },
        metadata={
            "probe_names": json.dumps(["p0", "p1", "p2", "p3"]),
            "activation": "sigmoid",
            "thresholds": json.dumps([0.5, 0.5, 0.9, None]),
        },
    )
    # What torch's safetensors.torch.save_file writes: {"format": "pt"} and nothing else.
    fx.save_specs(
        "probe_torch_style.safetensors",
        {
            "weight": (rng.standard_normal((2, 5)).astype(np.float32), "F32"),
            "bias": (rng.standard_normal(2).astype(np.float16), "F16"),
        },
        metadata={"format": "pt"},
    )


def check_demo(demo_bin, outdir):
    first = os.path.join(outdir, "demo.safetensors")
    second = os.path.join(outdir, "demo_again.safetensors")
    for path in (first, second):
        subprocess.run([demo_bin, path], check=True)
    with open(first, "rb") as f:
        data = f.read()
    with open(second, "rb") as f:
        if f.read() != data:
            sys.exit("make-demo-probe-set is not deterministic: two runs differ")
    os.remove(second)

    header_len = int.from_bytes(data[:8], "little")
    if header_len % 8 != 0:
        sys.exit(f"demo header length {header_len} is not a multiple of 8")
    tensors = dict(deserialize(data))  # the reference parser: raises on anything malformed
    if sorted(tensors) != ["bias", "weight"]:
        sys.exit(f"demo tensors: {sorted(tensors)}")
    if tensors["weight"]["dtype"] != "BF16" or list(tensors["weight"]["shape"]) != [4, 4096]:
        sys.exit(f"demo weight: {tensors['weight']['dtype']} {tensors['weight']['shape']}")
    if tensors["bias"]["dtype"] != "BF16" or list(tensors["bias"]["shape"]) != [4]:
        sys.exit(f"demo bias: {tensors['bias']['dtype']} {tensors['bias']['shape']}")
    with safe_open(first, framework="numpy") as f:
        metadata = f.metadata()
        keys = sorted(f.keys())
    expected = {
        "probe_names": ["probe_a", "probe_b", "probe_c", "probe_d"],
        "activation": "sigmoid",
        "thresholds": [0.5, 0.5, 0.9, None],
    }
    if keys != ["bias", "weight"] or set(metadata) != set(expected):
        sys.exit(f"demo keys {keys}, metadata {metadata}")
    for key, value in expected.items():
        got = metadata[key] if key == "activation" else json.loads(metadata[key])
        if got != value:
            sys.exit(f"demo metadata {key}: {got!r} != {value!r}")
    weight = bf16_to_float32(np.frombuffer(bytes(tensors["weight"]["data"]), dtype="<u2"))
    bias = bf16_to_float32(np.frombuffer(bytes(tensors["bias"]["data"]), dtype="<u2"))
    if not (np.all(np.isfinite(weight)) and np.all(np.isfinite(bias))):
        sys.exit("demo values are not finite")
    std, mean = float(weight.std()), float(weight.mean())
    if not (0.9 / 64 < std < 1.1 / 64) or abs(mean) > 0.05 / 64:
        sys.exit(f"demo weight statistics off: mean {mean}, std {std} (want ~0, ~1/64)")
    if float(np.abs(bias).max()) > 0.1:
        sys.exit(f"demo bias too large: {bias}")
    print(f"demo probe set OK: {len(data)} bytes, weight std {std:.5f}, deterministic")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("outdir")
    parser.add_argument("--demo-bin", help="path to make-demo-probe-set, checked with safetensors")
    args = parser.parse_args()
    os.makedirs(args.outdir, exist_ok=True)
    fx = Fixtures(args.outdir)
    make_fixtures(fx)
    fx.write_manifest()
    print(f"wrote {len(fx.manifest['files'])} fixtures with safetensors "
          f"{safetensors.__version__} to {args.outdir}")
    if args.demo_bin:
        check_demo(args.demo_bin, args.outdir)


if __name__ == "__main__":
    main()
