"""The client's pipelined ScoreStream (probe_sidecar.pipeline) against the real server, CPU
backend: many requests in flight on one stream, answers resolved in order, a failed message
fails only its own request, and a broken stream fails what was pending and reopens."""

from __future__ import annotations

import threading

import grpc
import numpy as np
import pytest

from conftest import Sidecar
from probe_files import safetensors_bytes
from probe_sidecar import ProbeSidecarError, score_request
from probe_sidecar.results import score_result
from probe_sidecar.pipeline import ScoreStreamPipeline

H, P = 64, 3


@pytest.fixture(scope="module")
def server():
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((P, H)).astype(np.float32)
    bias = rng.standard_normal(P).astype(np.float32)
    with Sidecar(["--backend=cpu"]) as s:
        with s.client() as c:
            c.load_probe_set("p", data=safetensors_bytes({"weight": (weight, "fp32"),
                                                          "bias": (bias, "fp32")}))
        yield s, weight, bias


def test_pipelined_requests_resolve_in_order_with_their_own_answers(server):
    s, weight, bias = server
    x = np.random.default_rng(1).standard_normal((32, H)).astype(np.float32)
    answered = []
    with s.client() as c:
        pipeline = ScoreStreamPipeline(c.stub)
        pendings = []
        for i in range(200):
            rows = [i % 32, (7 * i) % 32]
            request = score_request(x, rows, "p", request_id=i)
            pendings.append((rows, pipeline.submit(request, on_answer=lambda *_, i=i: answered.append(i))))
        for i, (rows, pending) in enumerate(pendings):
            result = score_result(pending.response(timeout=30))
            assert result.request_id == i
            np.testing.assert_allclose(result.scores, x[rows] @ weight.T + bias, rtol=1e-5,
                                       atol=1e-5)
        pipeline.close()
    assert answered == list(range(200))  # on_answer ran once per request, in order


def test_a_refused_message_fails_only_its_request(server):
    s, _, _ = server
    x = np.ones((4, H), np.float32)
    with s.client() as c:
        pipeline = ScoreStreamPipeline(c.stub)
        good = pipeline.submit(score_request(x, [0], "p"))
        bad = pipeline.submit(score_request(x, [9], "p"))  # row out of range
        unknown = pipeline.submit(score_request(x, [0], "nope"))
        after = pipeline.submit(score_request(x, [3], "p"))
        assert good.response(timeout=30).num_rows == 1
        with pytest.raises(ProbeSidecarError) as error:
            bad.response(timeout=30)
        assert error.value.code == grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(ProbeSidecarError) as error:
            unknown.response(timeout=30)
        assert error.value.code == grpc.StatusCode.NOT_FOUND
        assert after.response(timeout=30).num_rows == 1
        pipeline.close()


def test_concurrent_submitters_share_one_stream(server):
    s, weight, bias = server
    x = np.random.default_rng(2).standard_normal((8, H)).astype(np.float32)
    errors = []
    with s.client() as c:
        pipeline = ScoreStreamPipeline(c.stub)

        def submit_many(t):
            try:
                for i in range(50):
                    row = (t + i) % 8
                    pending = pipeline.submit(score_request(x, [row], "p"))
                    r = score_result(pending.response(timeout=30))
                    np.testing.assert_allclose(r.scores[0], x[row] @ weight.T + bias, rtol=1e-5,
                                               atol=1e-5)
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)

        threads = [threading.Thread(target=submit_many, args=(t,)) for t in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        pipeline.close()
    assert not errors, errors


def test_a_broken_stream_fails_what_is_pending_and_reopens(tmp_path):
    x = np.ones((2, H), np.float32)
    rng = np.random.default_rng(3)
    data = safetensors_bytes({"weight": (rng.standard_normal((P, H)).astype(np.float32), "fp32"),
                              "bias": (np.zeros(P, np.float32), "fp32")})
    first = Sidecar(["--backend=cpu"], workdir=tmp_path).start()
    with first.client() as c:
        c.load_probe_set("p", data=data)
        pipeline = ScoreStreamPipeline(c.stub, timeout=30)
        assert pipeline.submit(score_request(x, [0], "p")).response(timeout=30).num_rows == 1
        first.stop()  # the server goes away under the open stream
        with pytest.raises(ProbeSidecarError):
            pipeline.submit(score_request(x, [0], "p")).response(timeout=30)
        # A new server on the same socket: the next submit opens a new stream. (The probe set is
        # loaded over TCP, with an admin token: a second channel to the socket would share the
        # first one's backoff, and without an admin credential TCP clients may not load.)
        token = tmp_path / "token"
        token.write_text("pipeline-test-admin-token\n")
        with Sidecar(["--backend=cpu", f"--admin-token-file={token}"], workdir=tmp_path) as second, \
                second.client(transport="tcp", admin_token="pipeline-test-admin-token") as c2:
            c2.load_probe_set("p", data=data)
            deadline = 50
            while True:
                try:
                    assert pipeline.submit(score_request(x, [1], "p")).response(30).num_rows == 1
                    break
                except ProbeSidecarError:
                    deadline -= 1
                    if deadline == 0:
                        raise
                    threading.Event().wait(0.1)  # the channel reconnects with backoff
        pipeline.close()


def test_a_pending_answer_is_a_future(server):
    s, _, _ = server
    x = np.zeros((2, H), np.float32)
    with s.client() as c:
        pipeline = ScoreStreamPipeline(c.stub)
        pending = pipeline.submit(score_request(x, [0, 1], "p"))
        done = threading.Event()
        pending.add_done_callback(lambda _: done.set())
        assert pending.result(timeout=30).num_rows == 2 and done.wait(30)
        failed = pipeline.submit(score_request(x, [0], "no_such_set"))
        assert isinstance(failed.exception(timeout=30), ProbeSidecarError)
        pipeline.close()


def test_a_stream_outlives_the_unary_timeout(server):
    """The client's per-call timeout bounds unary calls, not a ScoreStream: a stream whose
    producer takes longer than it still completes."""
    s, _, _ = server
    x = np.zeros((1, H), np.float32)
    released = threading.Event()

    def requests():
        yield score_request(x, [0], "p")
        released.wait(30)  # the producer is slow: here until the first answer has been seen
        yield score_request(x, [0], "p")

    with s.client(timeout=0.2) as c:
        results = []
        for result in c.score_stream(requests()):
            results.append(result)
            timer = threading.Timer(0.5, released.set)  # well past the 0.2 s unary timeout
            timer.start()
        assert len(results) == 2
        assert not any(isinstance(r, ProbeSidecarError) for r in results)
