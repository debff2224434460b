"""numpy arrays <-> the API's TensorRef (inline bytes)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from probesidecar.v1 import tensor_pb2

from .dtypes import BY_NAME, BY_SHORT_NAME


def proto_dtype(array: np.ndarray, dtype: str | None) -> int:
    """The API dtype for ``array``; ``dtype`` ('bf16', 'fp16', 'fp32') overrides it.

    Raw bfloat16 bits can be passed as a uint16 array with ``dtype='bf16'``. numpy has no
    bfloat16; ml_dtypes (used by JAX and others) provides one named "bfloat16".
    """
    if dtype is not None:
        entry = BY_SHORT_NAME.get(dtype) or BY_NAME.get(dtype)
        if entry is None:
            raise ValueError(f"dtype must be one of bf16, fp16, fp32; got {dtype!r}")
        if array.dtype.itemsize != entry.size:
            raise ValueError(f"a {array.dtype} array cannot hold {dtype} elements")
        return entry.proto
    entry = BY_NAME.get(array.dtype.name)
    if entry is None:
        raise TypeError(
            f"activations must be float32, float16 or bfloat16 (ml_dtypes), got {array.dtype}; "
            "pass raw bfloat16 bits as uint16 with dtype='bf16'"
        )
    return entry.proto


def tensor_ref(array: np.ndarray, dtype: str | None = None) -> tensor_pb2.TensorRef:
    """An inline TensorRef for a 2-D array.

    A row-strided array (e.g. a slice of a wider buffer) is sent with its row stride, without
    repacking; any other layout is made contiguous first.
    """
    if array.ndim != 2:
        raise ValueError(f"activations must be 2-D [T, H], got shape {array.shape}")
    ref = tensor_pb2.TensorRef(dtype=proto_dtype(array, dtype), shape=list(array.shape))
    itemsize = array.dtype.itemsize
    rows, cols = array.shape
    row_stride_bytes = array.strides[0]
    strided_rows = (
        rows > 1
        and array.strides[1] == itemsize
        and row_stride_bytes > cols * itemsize
        and row_stride_bytes % itemsize == 0
    )
    if strided_rows:
        stride = row_stride_bytes // itemsize
        extent = (rows - 1) * stride + cols
        flat = np.lib.stride_tricks.as_strided(array, shape=(extent,), strides=(itemsize,))
        ref.row_stride = stride
        ref.data = flat.tobytes()
    else:
        ref.data = np.ascontiguousarray(array).tobytes()
    return ref


def rows_array(rows: npt.ArrayLike) -> np.ndarray:
    """Row indices as int32, refusing values that do not fit."""
    array = np.asarray(rows)
    if array.ndim != 1:
        raise ValueError(f"rows must be 1-D, got shape {array.shape}")
    if array.size and not np.issubdtype(array.dtype, np.integer):
        raise TypeError(f"rows must be integers, got {array.dtype}")
    if array.size and (array.min() < np.iinfo(np.int32).min or array.max() > np.iinfo(np.int32).max):
        raise ValueError("rows must fit in int32")
    return array.astype(np.int32, copy=False)
