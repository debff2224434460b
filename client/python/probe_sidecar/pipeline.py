"""A persistent ScoreStream for pipelined requests: submit() queues a request and returns at once;
the answers come back in order on a reader thread, which resolves each request's Pending.

The server answers the messages of one stream in order, one at a time; pipelining means the
client never waits for an answer before sending the next request.
"""

from __future__ import annotations

import collections
import concurrent.futures
import enum
import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Protocol

import grpc

from probesidecar.v1 import score_pb2

from .errors import ProbeSidecarError, error_from_rpc, status_code


class _Close(enum.Enum):
    CLOSE = enum.auto()


_CLOSE = _Close.CLOSE  # queued after the last request: half-closes the stream

# What runs when a request's answer arrives: (response, None), or (None, the failure).
OnAnswer = Callable[["score_pb2.ScoreResponse | None", "ProbeSidecarError | None"], None]


class ScoreStreamStub(Protocol):
    """What the pipeline needs of a stub: the ScoreStream call (sidecar_pb2_grpc's stub)."""

    def ScoreStream(self, request_iterator: Iterator[score_pb2.ScoreRequest], *,
                    timeout: float | None) -> Iterable[score_pb2.ScoreResponse]: ...


class Pending(concurrent.futures.Future["score_pb2.ScoreResponse"]):
    """The answer to one submitted request: a Future of its ScoreResponse (a ProbeSidecarError
    when it failed)."""

    def __init__(self, on_answer: OnAnswer | None):
        super().__init__()
        self._on_answer = on_answer

    def response(self, timeout: float | None = None) -> score_pb2.ScoreResponse:
        """Waits for the answer; raises ProbeSidecarError when the request failed."""
        try:
            return self.result(timeout)
        except concurrent.futures.TimeoutError:
            raise TimeoutError(f"no answer from probe-sidecar within {timeout} s") from None

    def _resolve(self, response: score_pb2.ScoreResponse | None = None,
                 error: ProbeSidecarError | None = None) -> None:
        if self._on_answer is not None:
            self._on_answer(response, error)  # before anyone waiting on the answer wakes
        if error is not None:
            self.set_exception(error)
        else:
            self.set_result(response)


class ScoreStreamPipeline:
    """One ScoreStream call, opened on first use and reopened after a failure."""

    def __init__(self, stub: ScoreStreamStub, timeout: float | None = None):
        self._stub = stub
        self._timeout = timeout
        self._lock = threading.Lock()
        self._requests: queue.SimpleQueue[score_pb2.ScoreRequest | _Close] | None = None
        self._pending: collections.deque[Pending] = collections.deque()
        self._reader: threading.Thread | None = None

    def submit(self, request: score_pb2.ScoreRequest,
               on_answer: OnAnswer | None = None) -> Pending:
        """Queues `request` on the stream; `on_answer(response, error)` runs on the reader thread
        when its answer (or failure: `error` is a ProbeSidecarError, `response` None) arrives,
        before anyone waiting on the Pending wakes."""
        pending = Pending(on_answer)
        with self._lock:
            requests = self._requests if self._requests is not None else self._open()
            self._pending.append(pending)
            requests.put(request)
        return pending

    def close(self) -> None:
        with self._lock:
            requests, reader = self._requests, self._reader
            self._requests = None
        if requests is not None:
            requests.put(_CLOSE)  # half-closes the stream; the reader drains what is left
        if reader is not None:
            reader.join(timeout=30)

    def _open(self) -> queue.SimpleQueue[score_pb2.ScoreRequest | _Close]:
        """Opens the stream (under _lock); returns the queue of its requests."""
        requests: queue.SimpleQueue[score_pb2.ScoreRequest | _Close] = queue.SimpleQueue()

        def outgoing() -> Iterator[score_pb2.ScoreRequest]:
            while True:
                item = requests.get()
                if item is _CLOSE:
                    return
                yield item

        call = self._stub.ScoreStream(outgoing(), timeout=self._timeout)
        self._requests = requests
        self._reader = threading.Thread(target=self._read, args=(call, requests), daemon=True,
                                        name="probe-sidecar-stream")
        self._reader.start()
        return requests

    def _read(self, call: Iterable[score_pb2.ScoreResponse],
              requests: queue.SimpleQueue[score_pb2.ScoreRequest | _Close]) -> None:
        try:
            for response in call:
                with self._lock:
                    pending = self._pending.popleft()
                if response.HasField("error"):
                    pending._resolve(error=ProbeSidecarError(status_code(response.error.code),
                                                             response.error.message))
                else:
                    pending._resolve(response=response)
            failure = ProbeSidecarError(grpc.StatusCode.UNAVAILABLE, "the stream ended")
        except grpc.RpcError as error:
            failure = error_from_rpc(error)
        # The stream is gone: whatever is still pending fails, and the next submit reopens.
        with self._lock:
            if self._requests is requests:
                self._requests = None
            orphans = list(self._pending)
            self._pending.clear()
        for pending in orphans:
            pending._resolve(error=failure)
