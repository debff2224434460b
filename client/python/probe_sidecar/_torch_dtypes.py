"""The element types a torch tensor may have in the API: one table for every torch module here."""

from __future__ import annotations

import torch

from probesidecar.v1 import tensor_pb2

PROTO_DTYPES = {
    torch.float32: tensor_pb2.DTYPE_FLOAT32,
    torch.float16: tensor_pb2.DTYPE_FLOAT16,
    torch.bfloat16: tensor_pb2.DTYPE_BFLOAT16,
}
