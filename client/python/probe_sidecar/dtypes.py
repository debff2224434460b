"""The element types the API carries for activations: ONE table of facts (name, short name, proto
enum, the numpy type that holds an element, its size), read as a numpy view (BY_NAME,
BY_SHORT_NAME) and a torch view (of_torch). Importing this module never imports torch: the torch
view is made on first use. A bottom module: it imports nothing else of the package."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING

import numpy as np

from probesidecar.v1 import tensor_pb2

if TYPE_CHECKING:
    import torch  # for the annotations only: importing this module never imports torch


@dataclasses.dataclass(frozen=True)
class DType:
    """One element type of the API."""

    name: str  # "float32", "float16", "bfloat16": numpy's (ml_dtypes' for bfloat16) and torch's
    short: str  # "fp32", "fp16", "bf16"
    proto: int  # probesidecar.v1.DType
    numpy: type  # the numpy type that holds one element (bfloat16: its raw bits, uint16)

    @property
    def size(self) -> int:
        """Bytes per element."""
        return np.dtype(self.numpy).itemsize

    @property
    def torch(self) -> torch.dtype:
        """The torch dtype (imports torch)."""
        import torch

        dtype: torch.dtype = getattr(torch, self.name)
        return dtype


TABLE: tuple[DType, ...] = (
    DType("float32", "fp32", tensor_pb2.DTYPE_FLOAT32, np.float32),
    DType("float16", "fp16", tensor_pb2.DTYPE_FLOAT16, np.float16),
    DType("bfloat16", "bf16", tensor_pb2.DTYPE_BFLOAT16, np.uint16),  # numpy has no bfloat16
)

BY_NAME: Mapping[str, DType] = MappingProxyType({d.name: d for d in TABLE})
BY_SHORT_NAME: Mapping[str, DType] = MappingProxyType({d.short: d for d in TABLE})


@functools.cache
def _by_torch() -> dict[torch.dtype, DType]:
    return {d.torch: d for d in TABLE}


def of_torch(dtype: torch.dtype) -> DType | None:
    """The entry of a torch dtype; None for a dtype the API does not carry (imports torch)."""
    return _by_torch().get(dtype)


__all__ = ["BY_NAME", "BY_SHORT_NAME", "DType", "TABLE", "of_torch"]
