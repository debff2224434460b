"""The package's errors, and the mapping from a failed gRPC call (or a refused stream message) to
ProbeSidecarError. A bottom module: it imports nothing else of the package."""

from __future__ import annotations

import grpc


class ProbeSidecarError(Exception):
    """A failed call: ``code`` is the gRPC status code, ``message`` the server's explanation."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message


class TapError(RuntimeError):
    """A misuse of a tap, or a window that could not be scored (``window.error``)."""


def status_code(value: int) -> grpc.StatusCode:
    """The grpc.StatusCode of a numeric status (a ScoreStream message's ``error.code``); UNKNOWN
    for a number grpc does not know."""
    for code in grpc.StatusCode:
        if code.value[0] == value:
            return code
    return grpc.StatusCode.UNKNOWN


def error_from_rpc(error: grpc.RpcError) -> ProbeSidecarError:
    """The ProbeSidecarError for a failed call (returned, for the caller to raise)."""
    return ProbeSidecarError(error.code(), error.details() or "")


__all__ = ["ProbeSidecarError", "TapError", "error_from_rpc", "status_code"]
