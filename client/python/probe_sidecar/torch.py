"""Zero-copy scoring of PyTorch CUDA tensors: register a tensor's storage once (CUDA IPC), then
send only references.

    from probe_sidecar.torch import TorchClient
    client = TorchClient("unix:///tmp/probe-sidecar.sock")
    result = client.score(hidden_states, rows, "demo")   # hidden_states: CUDA [T, H]

The caller must not overwrite the tensor until score() returns (the server reads it during the
call); score() waits for the current CUDA stream before sending, so work queued on it that
writes the tensor is complete.

Registrations belong to a session that the client holds open: when this process exits (or
close() is called) the server releases them. A registered storage is kept alive by the client
until unregister() or close(), so its memory cannot be freed and reused under the server.
"""

from __future__ import annotations

import dataclasses
import os

import grpc
import torch

from probesidecar.v1 import buffers_pb2, score_pb2, tensor_pb2

from ._tensors import rows_array
from .client import Client, ProbeSidecarError, ScoreResult, _raise, _result

_DTYPES = {
    torch.float32: tensor_pb2.DTYPE_FLOAT32,
    torch.float16: tensor_pb2.DTYPE_FLOAT16,
    torch.bfloat16: tensor_pb2.DTYPE_BFLOAT16,
}


@dataclasses.dataclass(frozen=True)
class Registration:
    buffer_id: int
    storage_ptr: int  # data_ptr() of the registered storage
    nbytes: int
    shared_mapping: bool


class TorchClient:
    """A Client that sends CUDA tensors by reference."""

    def __init__(self, target: str | Client = "unix:///tmp/probe-sidecar.sock", **kwargs):
        self.client = target if isinstance(target, Client) else Client(target, **kwargs)
        self._registered: dict[tuple[int, int], tuple[Registration, torch.UntypedStorage]] = {}
        # The session lease: the server releases our buffers when this call ends.
        self._session_call = self.client.stub.OpenSession(
            buffers_pb2.OpenSessionRequest(client_pid=os.getpid())
        )
        try:
            self.session_id = next(self._session_call).session_id
        except grpc.RpcError as error:
            raise _raise(error) from None

    def close(self) -> None:
        for registration, _ in list(self._registered.values()):
            try:
                self.client.stub.UnregisterBuffer(
                    buffers_pb2.UnregisterBufferRequest(buffer_id=registration.buffer_id), timeout=10
                )
            except grpc.RpcError:
                pass  # the session's end releases it anyway
        self._registered.clear()
        self._session_call.cancel()
        self.client.close()

    def __enter__(self) -> "TorchClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def register(self, tensor: torch.Tensor, name: str = "") -> Registration:
        """Registers the storage behind ``tensor`` (once per storage; cached)."""
        if not tensor.is_cuda:
            raise ValueError("register() needs a CUDA tensor")
        storage = tensor.untyped_storage()
        key = (storage.data_ptr(), storage.nbytes())
        if key in self._registered:
            return self._registered[key][0]
        # (device, handle, storage bytes, offset of the storage in its cudaMalloc block, ...)
        shared = storage._share_cuda_()
        device, handle, size_bytes, offset_bytes = shared[0], shared[1], shared[2], shared[3]
        request = buffers_pb2.RegisterBufferRequest(
            name=name or f"torch:{key[0]:#x}",
            device_id=device,
            handle=bytes(handle),
            offset_bytes=offset_bytes,
            byte_size=size_bytes,
            client_pid=os.getpid(),
            session_id=self.session_id,
        )
        response = self.client._call(self.client.stub.RegisterBuffer, request)
        registration = Registration(response.buffer_id, key[0], key[1], response.shared_mapping)
        self._registered[key] = (registration, storage)
        return registration

    def unregister(self, tensor: torch.Tensor) -> bool:
        """Releases the registration of ``tensor``'s storage; True when the server deferred it."""
        storage = tensor.untyped_storage()
        entry = self._registered.pop((storage.data_ptr(), storage.nbytes()), None)
        if entry is None:
            raise KeyError("tensor's storage is not registered")
        request = buffers_pb2.UnregisterBufferRequest(buffer_id=entry[0].buffer_id)
        return self.client._call(self.client.stub.UnregisterBuffer, request).deferred

    def tensor_ref(self, tensor: torch.Tensor) -> tensor_pb2.TensorRef:
        """A TensorRef to a 2-D CUDA tensor (rows may be strided; columns contiguous)."""
        if tensor.dim() != 2:
            raise ValueError(f"expected a 2-D tensor, got shape {tuple(tensor.shape)}")
        if tensor.dtype not in _DTYPES:
            raise TypeError(f"dtype {tensor.dtype} is not bfloat16, float16 or float32")
        if tensor.shape[1] > 1 and tensor.stride(1) != 1:
            raise ValueError("the tensor's rows must be contiguous (stride(1) == 1)")
        registration = self.register(tensor)
        offset = tensor.data_ptr() - registration.storage_ptr
        ref = tensor_pb2.TensorRef(dtype=_DTYPES[tensor.dtype], shape=list(tensor.shape),
                                   row_stride=tensor.stride(0))
        ref.buffer.buffer_id = registration.buffer_id
        ref.buffer.offset_bytes = offset
        return ref

    def score(
        self,
        hidden_states: torch.Tensor,
        rows,
        probe_set: str,
        *,
        out: torch.Tensor | None = None,
        request_id: int = 0,
    ) -> ScoreResult:
        """Scores ``hidden_states[rows]`` with a loaded probe set, reading the tensor in place.

        With ``out`` (a float32 CUDA tensor [R, P]) the scores are written there and the result
        carries no scores (``fired`` is empty too); otherwise they come back inline.
        """
        if isinstance(rows, torch.Tensor):
            rows = rows.detach().cpu().numpy()
        request = score_pb2.ScoreRequest(probe_set=probe_set, request_id=request_id)
        request.activations.CopyFrom(self.tensor_ref(hidden_states))
        request.rows.extend(rows_array(rows).tolist())
        if out is not None:
            if out.dtype != torch.float32:
                raise TypeError("out must be float32")
            request.output.CopyFrom(self.tensor_ref(out))
        # v1 ordering: the server reads after this returns, so the writes must have landed.
        torch.cuda.current_stream(hidden_states.device).synchronize()
        return _result(self.client._call(self.client.stub.Score, request))


__all__ = ["TorchClient", "Registration", "ProbeSidecarError"]
