"""FlashMLA's sm90 dense decode as an MLA verify peer (impl "flashmla"), through the C entry
points of libflashmla_peer.so (bench/mla_verify/flashmla/build.sh builds it from a FlashMLA
checkout; FLASHMLA_PEER_LIB names it). As an inference server runs it: the split plan
(FlashMLA's get_mla_metadata) is made once for the lengths, outside the graph; the graph holds the
split-KV kernel and the combine."""
from __future__ import annotations

import ctypes
import os

import torch

_I, _P, _F, _L = ctypes.c_int, ctypes.c_void_p, ctypes.c_float, ctypes.c_int64


class FlashMLAPeer:
    def __init__(self, log, path=None):
        path = path or os.environ.get("FLASHMLA_PEER_LIB", "")
        if not path or not os.path.exists(path):
            raise FileNotFoundError(f"FLASHMLA_PEER_LIB={path!r}: no libflashmla_peer.so "
                                    "(bench/mla_verify/flashmla/build.sh)")
        self.lib = ctypes.CDLL(path)
        self.lib.flashmla_peer_sm_parts.argtypes = [_I, _I, _I]
        self.lib.flashmla_peer_plan.argtypes = [_I, _I, _P, _P, _P, _I, _P]
        self.lib.flashmla_peer_decode.argtypes = [_I, _I, _I, _F, _P, _P, _I, _P, _L, _P, _P, _P,
                                                  _I, _P, _P, _P, _P, _P]
        info = os.path.join(os.path.dirname(path), "flashmla_peer.txt")
        self.version = open(info).read().strip() if os.path.exists(info) else "unknown build"
        self.sms = torch.cuda.get_device_properties(0).multi_processor_count
        log(f"flashmla: {self.version}")

    def prepare(self, batch, s_q, h_q, length, scale, sets_q, sets_kv, sets_out):
        """One callable per input set (each set's pages in order: request i holds pages
        [i * pages, (i + 1) * pages) of its set's KV), and what they need kept alive."""
        dev = "cuda"
        pages = (length + 63) // 64
        rows = s_q * h_q
        parts = self.lib.flashmla_peer_sm_parts(self.sms, s_q, h_q)
        words = self.lib.flashmla_peer_sched_words()
        lengths = torch.full((batch,), length, dtype=torch.int32, device=dev)
        sched = torch.empty(parts, words, dtype=torch.int32, device=dev)
        splits = torch.empty(batch + 1, dtype=torch.int32, device=dev)
        stream = torch.cuda.current_stream().cuda_stream
        rc = self.lib.flashmla_peer_plan(batch, s_q, lengths.data_ptr(), sched.data_ptr(),
                                         splits.data_ptr(), parts, stream)
        if rc != 0:
            raise RuntimeError(f"flashmla plan failed ({rc})")
        lse = torch.empty(batch, rows, dtype=torch.float32, device=dev)
        lse_accum = torch.empty(batch + parts, rows, dtype=torch.float32, device=dev)
        o_accum = torch.empty(batch + parts, rows, 512, dtype=torch.float32, device=dev)
        table = torch.arange(batch * pages, dtype=torch.int32, device=dev).view(batch, pages)
        keep = [lengths, sched, splits, lse, lse_accum, o_accum, table]

        def call(q, kv, out):
            rc = self.lib.flashmla_peer_decode(
                batch, s_q, h_q, scale, q.data_ptr(), kv.data_ptr(), kv.shape[0],
                table.data_ptr(), table.stride(0), lengths.data_ptr(), sched.data_ptr(),
                splits.data_ptr(), parts, out.data_ptr(), lse.data_ptr(), lse_accum.data_ptr(),
                o_accum.data_ptr(), torch.cuda.current_stream().cuda_stream)
            if rc != 0:
                raise RuntimeError(f"flashmla decode failed ({rc})")

        fns = [lambda q=q, kv=kv, o=o: call(q, kv, o)
               for q, kv, o in zip(sets_q, sets_kv, sets_out)]
        return keep, fns
