"""MLA verify peers on the GPU machine: a torch reference (gather pages, two matmuls, softmax),
FlashInfer's MLA paged decode (fa3 backend) and FlashMLA's sm90 dense decode (flashmla_peer.py:
FLASHMLA_PEER_LIB names the library bench/mla_verify/flashmla/build.sh builds), under CUDA-graph
replay, on the same sweep and the same input rotation as bench/mla_verify/mla_verify_bench.cu.

  python3 peers.py --out peers.json --git HASH [--allow-dirty] [--sweep full|quick|targets]
                   [--impls torch_ref,flashinfer_fa3,flashmla] [--points H:S:B:L,...]

Writes {device, git, date, command, notes, skipped, records}; bench/mla_verify/report.py merges
it with the CUDA benchmark's file (whose ceilings both are measured against).
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import receipt  # noqa: E402  (bench/receipt.py)
from flashmla_peer import FlashMLAPeer  # noqa: E402

ROTATE_BYTES = 400e6
MAX_SETS = 8
TORCH_REF_LIMIT = 8e9  # bytes of intermediates (gathered keys + float32 scores) beyond which
                       # the torch reference is skipped


def sweep_points(kind):
    if kind == "targets":  # mla_verify_bench.cu's targets sweep, in its order
        pts = [(16, s, b, l) for s in (1, 2, 4)
               for (b, l) in ((64, 4096), (64, 16384), (128, 4096), (128, 65536))]
        pts += [(128, s, 64, 16384) for s in (1, 2, 4, 8)]
        pts += [(16, s, 1, 65536) for s in (1, 2, 4, 8)]
        return pts + [(16, 1, 128, 1024), (16, 8, 64, 4096), (128, 1, 8, 1024), (128, 8, 1, 1024)]
    sqs = [1, 4] if kind == "quick" else [1, 2, 4, 8]
    batches = [1, 64] if kind == "quick" else [1, 8, 64, 128]
    lens = [4096, 65536] if kind == "quick" else [1024, 4096, 16384, 65536]
    return [(h, s, b, l) for h in (16, 128) for s in sqs for b in batches for l in lens]


def sets_for(batch, length):
    return max(1, min(MAX_SETS, math.ceil(ROTATE_BYTES / (batch * length * 576 * 2))))


def bytes_of(h, s, b, l):
    return b * (l * 576 * 2 + s * h * (576 + 512) * 2)


def flops_of(h, s, b, l):
    return 2.0 * h * (576 + 512) * (s * l - s * (s - 1) / 2.0) * b


def time_graphs(graphs, reps=None):
    """Median µs of single replays, rotating over the graphs, after warm-up."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for i in range(3):
        graphs[i % len(graphs)].replay()
    end.record()
    end.synchronize()
    est_ms = start.elapsed_time(end) / 3
    if reps is None:
        reps = max(10, min(200, int(60.0 / max(est_ms, 1e-3))))
    times = []
    for i in range(reps):
        start.record()
        graphs[i % len(graphs)].replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    times.sort()
    n = len(times)
    return times[n // 2] if n % 2 else 0.5 * (times[n // 2 - 1] + times[n // 2])


def capture(fn):
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()  # warm-up outside the graph (JIT, allocator)
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
        fn()
    return g


def torch_ref(q, kv, table, length, s_q, h_q, scale, mask):
    """q [b, s_q, h_q, 576], kv [pages, 64, 576], table [b, pages]: out [b, s_q, h_q, 512]."""
    b = q.shape[0]
    k = kv[table].reshape(b, -1, 576)[:, :length]                  # gather pages
    scores = torch.matmul(q.reshape(b, s_q * h_q, 576), k.transpose(1, 2)).float() * scale
    scores.masked_fill_(mask, float("-inf"))
    p = torch.softmax(scores, dim=-1).to(torch.bfloat16)
    return torch.matmul(p, k[..., :512]).reshape(b, s_q, h_q, 512)


def causal_mask(s_q, h_q, length, device):
    j = torch.arange(s_q, device=device).repeat_interleave(h_q)      # row = j * h_q + h
    key = torch.arange(length, device=device)
    return key[None, :] > (length - s_q + j)[:, None]                  # [s_q * h_q, L]


class FlashInferPeer:
    def __init__(self, log):
        import flashinfer  # noqa: F401
        from flashinfer.mla import BatchMLAPagedAttentionWrapper, MLAPlanMetadata
        self.wrapper_cls = BatchMLAPagedAttentionWrapper
        self.meta_cls = MLAPlanMetadata
        self.version = flashinfer.__version__
        self.workspace = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
        self.layout = None  # "packed" or "split", found on the first point
        self.log = log

    def prepare(self, batch, s_q, h_q, length, scale, sets_q, sets_kv, sets_out):
        pages = (length + 63) // 64
        dev = "cuda"
        qo_indptr = torch.arange(batch + 1, dtype=torch.int32, device=dev) * s_q
        kv_indptr = torch.arange(batch + 1, dtype=torch.int32, device=dev) * pages
        kv_indices = torch.arange(batch * pages, dtype=torch.int32, device=dev)
        kv_len = torch.full((batch,), length, dtype=torch.int32, device=dev)
        layouts = [self.layout] if self.layout else ["packed", "split"]
        last_error = None
        for layout in layouts:
            try:
                w = self.wrapper_cls(self.workspace, use_cuda_graph=True, qo_indptr=qo_indptr.clone(),
                                     kv_indptr=kv_indptr.clone(), kv_indices=kv_indices.clone(),
                                     kv_len_arr=kv_len.clone(), backend="fa3")
                w.plan(metadata=self.meta_cls.csr(qo_indptr, kv_indptr, kv_indices, kv_len),
                       num_heads=h_q, head_dim_ckv=512, head_dim_kpe=64, page_size=64,
                       causal=True, sm_scale=scale, q_data_type=torch.bfloat16,
                       kv_data_type=torch.bfloat16, query_layout=layout,
                       kv_cache_layout=layout)
                fns = []
                for q, kv, out in zip(sets_q, sets_kv, sets_out):
                    qf = q.reshape(batch * s_q, h_q, 576)
                    of = out.reshape(batch * s_q, h_q, 512)
                    if layout == "packed":
                        args = dict(query=qf, kv_cache=kv)
                    else:
                        args = dict(query=(qf[..., :512], qf[..., 512:]),
                                    kv_cache=(kv[..., :512], kv[..., 512:]))
                    fns.append(lambda w=w, a=args, o=of: w.run(out=o, **a))
                fns[0]()
                torch.cuda.synchronize()
                if self.layout is None:
                    self.log(f"flashinfer {self.version}: fa3 with {layout} query/kv layout")
                self.layout = layout
                return w, fns
            except Exception as e:  # try the other layout
                last_error = e
                self.log(f"flashinfer fa3 {layout} layout failed: {type(e).__name__}: {e}")
        raise last_error


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--sweep", default="full")
    ap.add_argument("--impls", default="torch_ref,flashinfer_fa3")
    ap.add_argument("--points", default="", help="only these points of the sweep (h:s:b:len,...)")
    ap.add_argument("--warm-only", action="store_true",
                    help="only JIT-build FlashInfer's fa3 module (run beside the GPU tests)")
    receipt.add_arguments(ap)
    args = ap.parse_args()
    if args.warm_only:
        fi = FlashInferPeer(print)
        q = torch.randn(1, 1, 16, 576, device="cuda").to(torch.bfloat16)
        kv = torch.randn(16, 64, 576, device="cuda").to(torch.bfloat16)
        out = torch.empty(1, 1, 16, 512, dtype=torch.bfloat16, device="cuda")
        fi.prepare(1, 1, 16, 1024, 0.07, [q], [kv], [out])
        torch.cuda.synchronize()
        print("flashinfer fa3 module ready")
        return
    git = receipt.from_args(args)
    notes, skipped, records = [], [], []

    def log(msg):
        print(msg, flush=True)
        notes.append(msg)

    torch.manual_seed(int(time.time()))
    dev = torch.device("cuda")
    pool_pages = int(11e9 // (64 * 576 * 2))
    kv_pool = torch.empty(pool_pages, 64, 576, dtype=torch.bfloat16, device=dev)
    for i in range(0, pool_pages, 8192):  # random, never zeros (chunks to bound temporaries)
        kv_pool[i:i + 8192].uniform_(-1.0, 1.0)
    q_pool = (torch.rand(200 << 20, device=dev) * 4 - 2).to(torch.bfloat16)
    out_pool = torch.empty(200 << 20, dtype=torch.bfloat16, device=dev)
    impls = args.impls.split(",")
    fi = None
    if "flashinfer_fa3" in impls:
        try:
            fi = FlashInferPeer(log)
        except Exception as e:
            log(f"flashinfer unavailable: {type(e).__name__}: {e}")
            traceback.print_exc()
    peers = {}  # impl -> its peer object, those that could start
    if fi is not None:
        peers["flashinfer_fa3"] = fi
    if "flashmla" in impls:
        try:
            peers["flashmla"] = FlashMLAPeer(log)
        except Exception as e:
            log(f"flashmla unavailable: {type(e).__name__}: {e}")
    checked = set()  # peers whose output was checked against the torch reference
    only = {tuple(int(x) for x in p.split(":")) for p in args.points.split(",") if p}
    for (h, s, b, l) in sweep_points(args.sweep):
        if only and (h, s, b, l) not in only:
            continue
        sets = sets_for(b, l)
        pages = (l + 63) // 64
        pps = b * pages
        name = f"h_q={h} s_q={s} batch={b} len={l}"
        if pps * sets > pool_pages or sets * b * s * h * 576 > q_pool.numel():
            skipped.append(f"{name} (inputs do not fit the pools)")
            continue
        scale = 1.0 / math.sqrt(192.0)
        qn, on = b * s * h * 576, b * s * h * 512
        sets_q = [q_pool[i * qn:(i + 1) * qn].view(b, s, h, 576) for i in range(sets)]
        sets_out = [out_pool[i * on:(i + 1) * on].view(b, s, h, 512) for i in range(sets)]
        sets_kv = [kv_pool[i * pps:(i + 1) * pps] for i in range(sets)]
        table = torch.arange(pps, dtype=torch.int64, device=dev).view(b, pages)

        def record(impl, us):
            by, fl = bytes_of(h, s, b, l), flops_of(h, s, b, l)
            records.append({"bench": "mla_verify", "impl": impl, "dtype": "bf16",
                            "shape": {"batch": b, "s_q": s, "h_q": h, "seqlen": l, "page_size": 64},
                            "graph_us_p50": round(us, 2), "eager_us_p50": None,
                            "gbps": round(by / (us * 1e-6) / 1e9, 1),
                            "tflops": round(fl / (us * 1e-6) / 1e12, 1)})
            print(f"{name:40s} {impl:15s} {us:10.1f} us", flush=True)

        if "torch_ref" in impls:
            inter = b * l * 576 * 2 + b * s * h * l * 4 * 2
            if inter > TORCH_REF_LIMIT:
                skipped.append(f"torch_ref {name} (intermediates {inter / 1e9:.1f} GB > 8 GB)")
            else:
                try:
                    mask = causal_mask(s, h, l, dev)
                    graphs = []
                    for i in range(sets):
                        def fn(i=i):
                            sets_out[i].copy_(torch_ref(sets_q[i], sets_kv[i], table, l, s, h,
                                                        scale, mask))
                        graphs.append(capture(fn))
                    record("torch_ref", time_graphs(graphs))
                    del graphs
                except torch.OutOfMemoryError:
                    skipped.append(f"torch_ref {name} (out of memory)")
                torch.cuda.empty_cache()
        for impl, peer in peers.items():
            try:
                held, fns = peer.prepare(b, s, h, l, scale, sets_q, sets_kv, sets_out)
                if impl not in checked and l <= 4096:
                    # Right use of the API: the peer's output against the torch reference.
                    fns[0]()
                    ref = torch_ref(sets_q[0], sets_kv[0], table, l, s, h, scale,
                                    causal_mask(s, h, l, dev)).float()
                    err = (sets_out[0].float() - ref).abs().max().item()
                    rel = ((sets_out[0].float() - ref).norm() / ref.norm()).item()
                    log(f"{impl} check at {name}: max abs err {err:.3g}, rel L2 {rel:.3g} "
                        "against the torch reference")
                    checked.add(impl)
                graphs = [capture(fn) for fn in fns]
                record(impl, time_graphs(graphs))
                del graphs, held, fns
            except Exception as e:
                skipped.append(f"{impl} {name} ({type(e).__name__}: {str(e)[:200]})")
                print(f"{impl} failed at {name}: {e}", flush=True)
            torch.cuda.empty_cache()
        write(args.out, git, notes, skipped, records)  # after every point: a timeout keeps them


def write(path, git, notes, skipped, records):
    doc = {"device": torch.cuda.get_device_name(0), "git": git,
           "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
           "command": " ".join(["python3"] + sys.argv), "torch": torch.__version__,
           "notes": notes, "skipped": skipped, "records": records}
    with open(path + ".tmp", "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(path + ".tmp", path)


if __name__ == "__main__":
    main()
