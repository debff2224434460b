"""Probe-set files written by the real `safetensors` package, and a float64 reference; for the GPU
tests, random bfloat16 probe weights in torch and their float64 reference (torch is imported only
by those: the CPU tests need no torch)."""

from __future__ import annotations

import json

import numpy as np
import safetensors


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits (uint16), round to nearest even."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def as_dtype(x: np.ndarray, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """(the array to send or store, its exact float32 value) for 'fp32', 'fp16' or 'bf16'."""
    x = np.asarray(x, dtype=np.float32)
    if dtype == "fp32":
        return x, x
    if dtype == "fp16":
        h = x.astype(np.float16)
        return h, h.astype(np.float32)
    if dtype == "bf16":
        b = bf16_bits(x)
        return b, bf16_to_f32(b)
    raise ValueError(dtype)


_SPEC_DTYPE = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


def safetensors_bytes(tensors: dict[str, tuple[np.ndarray, str]], metadata: dict | None = None) -> bytes:
    """Serialises {name: (array, dtype)} with the safetensors package (bf16 as uint16 bits)."""
    keep = []
    specs = {}
    for name, (array, dtype) in tensors.items():
        array = np.ascontiguousarray(array)
        keep.append(array)
        specs[name] = safetensors.TensorSpec(
            dtype=_SPEC_DTYPE[dtype], shape=list(array.shape), data_ptr=array.ctypes.data, data_len=array.nbytes
        )
    return bytes(safetensors.serialize(specs, metadata=metadata))


def bf16_tensor_file(weight, bias, metadata: dict | None = None) -> bytes:
    """A probe file of torch bfloat16 tensors `weight` [P, H] and `bias` [P], bit for bit (a
    bfloat16 value is exact in float32, and rounds back to its own bits)."""
    def bits(t):
        return bf16_bits(t.detach().float().cpu().numpy())

    return safetensors_bytes({"weight": (bits(weight), "bf16"), "bias": (bits(bias), "bf16")},
                             metadata)


def bf16_probes(num_probes: int, hidden: int, *, device="cuda", generator=None):
    """Random probe weights as torch tensors: weight [P, H] ~ N(0, 1/H) and bias [P] ~ N(0, 0.01),
    rounded to bfloat16, drawn in that order on `device` from `generator` (default: torch's
    global generator)."""
    import torch

    weight = torch.randn(num_probes, hidden, device=device, generator=generator) / hidden**0.5
    bias = torch.randn(num_probes, device=device, generator=generator) * 0.1
    return weight.to(torch.bfloat16), bias.to(torch.bfloat16)


def float64_scores(x, rows, weight, bias):
    """x[rows] @ weight^T + bias in float64 on x's device, of torch tensors (`rows`: a list or a
    tensor of indices, or None for every row of x)."""
    import torch

    if rows is not None:
        x = x.index_select(0, torch.as_tensor(rows, device=x.device).long())
    return torch.addmm(bias.double().to(x.device), x.double(), weight.double().to(x.device).t())


class ProbeFile:
    """A random probe set: its file bytes and the exact float32 weights the server will hold."""

    def __init__(self, num_probes: int, hidden: int, *, dtype: str = "fp32", seed: int = 0,
                 activation: str | None = None, thresholds: list | None = None,
                 names: list[str] | None = None, extra_metadata: dict | None = None):
        rng = np.random.default_rng(seed)
        w, self.weight = as_dtype(rng.standard_normal((num_probes, hidden)) / np.sqrt(hidden), dtype)
        b, self.bias = as_dtype(rng.standard_normal(num_probes) * 0.1, dtype)
        self.activation = activation or "none"
        self.thresholds = thresholds
        self.names = names or [f"probe_{i}" for i in range(num_probes)]
        metadata = dict(extra_metadata or {})
        if names is not None:
            metadata["probe_names"] = json.dumps(names)
        if activation is not None:
            metadata["activation"] = activation
        if thresholds is not None:
            metadata["thresholds"] = json.dumps(thresholds)
        self.data = safetensors_bytes({"weight": (w, dtype), "bias": (b, dtype)}, metadata or None)

    def reference(self, x: np.ndarray, rows) -> np.ndarray:
        """float64 scores of float32 activations x (exact values) at rows."""
        scores = x[np.asarray(rows)].astype(np.float64) @ self.weight.astype(np.float64).T + self.bias
        if self.activation == "sigmoid":
            scores = 1.0 / (1.0 + np.exp(-scores))
        return scores

    def fired(self, scores: np.ndarray) -> np.ndarray:
        mask = np.zeros(scores.shape, dtype=bool)
        for p, threshold in enumerate(self.thresholds or []):
            if threshold is not None:
                mask[:, p] = scores[:, p] >= threshold
        return mask


def rel_error(got, want) -> float:
    """||got - want|| / ||want||, in float64: of numpy arrays, or against a torch reference `want`
    (then `got` is a numpy array or a tensor on any device, compared on want's device)."""
    if isinstance(want, np.ndarray):
        got = np.asarray(got, dtype=np.float64)
        return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-300))
    import torch  # only where the reference is a tensor: the CPU tests need no torch

    want = want.double()
    got = torch.as_tensor(got).to(device=want.device, dtype=torch.float64)
    return float(torch.linalg.norm(got - want) / torch.linalg.norm(want))
