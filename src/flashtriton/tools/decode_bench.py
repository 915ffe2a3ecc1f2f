"""The `decode` suite: one (or a few) query tokens per sequence against a KV cache, bf16 (GPU only).

Decoding reads K and V once and does almost no arithmetic, so its limit is HBM bandwidth: each row
reports ms and the achieved bandwidth (bytes of K and V read, plus Q and O, over the time) beside a read
ceiling measured in the same run (the fastest of `torch.sum` and a plain Triton reduction over 4 GiB and
16 GiB), for flashtriton's
`flash_attention_with_kvcache` and for PyTorch's SDPA backends cuDNN and FlashAttention-2 (`sdpa_flash`),
which take the contiguous cache (B, H, N, D) with `enable_gqa` and have no paged cache: their paged cells
are empty. One chunked-prefill row (Nq = 512 against 16k cached keys, causal) is reported in TFLOP/s
beside the dense forward at N = 4096.

Two timings per call, each the median of ROUNDS interleaved rounds: `ms`, triton.testing.do_bench
(eager calls, L2 flushed before each: a call's host time shows where it outlasts the flush), and
`graph_ms`, triton.testing.do_bench_cudagraph (the calls replayed from a CUDA graph, as serving engines
run decoding: GPU time alone). Paged rows also give their graph time against the contiguous row's.
"""

from __future__ import annotations

import contextlib
import json
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from ..launch.arguments import COMPILE_OPTIONS

ROUNDS = 3
MAX_KV_BYTES = 16 * 2**30  # skip shapes whose K + V would take more than this
PREFILL = dict(batch=4, heads_q=32, heads_kv=8, seqlen_q=512, seqlen_k=16384, head_dim=128)


@dataclass(frozen=True)
class DecodeShape:
    batch: int
    heads_q: int
    heads_kv: int
    seqlen_k: int
    head_dim: int
    seqlen_q: int = 1
    layout: str = "contiguous"  # or "paged16", "paged64": block size 16 or 64
    causal: bool = False

    @property
    def kv_bytes(self) -> int:
        return 2 * self.batch * self.heads_kv * self.seqlen_k * self.head_dim * 2

    @property
    def bytes_moved(self) -> int:
        return self.kv_bytes + 2 * self.batch * self.heads_q * self.seqlen_q * self.head_dim * 2

    @property
    def flops(self) -> float:
        pairs = self.seqlen_q * self.seqlen_k - (self.seqlen_q * (self.seqlen_q - 1) // 2 if self.causal else 0)
        return 4.0 * self.batch * self.heads_q * pairs * self.head_dim


def decode_suite() -> list[DecodeShape]:
    """B x Nk x heads x D with Nq = 1 on a contiguous cache; at D = 128 and GQA 32/8 also paged caches
    (block size 16 and 64) and Nq = 4; shapes whose K + V pass MAX_KV_BYTES are left out."""
    shapes = []
    for head_dim in (128, 64):  # the common head dim first, with the paged and Nq = 4 rows
        for heads_q, heads_kv in ((32, 32), (32, 8), (64, 8)):
            for batch in (1, 8, 64, 256):
                for seqlen_k in (1024, 8192, 32768, 131072):
                    base = DecodeShape(batch, heads_q, heads_kv, seqlen_k, head_dim)
                    if base.kv_bytes > MAX_KV_BYTES:
                        continue
                    shapes.append(base)
                    if head_dim == 128 and (heads_q, heads_kv) == (32, 8):
                        shapes += [DecodeShape(batch, heads_q, heads_kv, seqlen_k, head_dim, seqlen_q=4),
                                   DecodeShape(batch, heads_q, heads_kv, seqlen_k, head_dim, layout="paged16"),
                                   DecodeShape(batch, heads_q, heads_kv, seqlen_k, head_dim, layout="paged64")]
    return shapes


@triton.jit
def _sum_kernel(X, OUT, per_program, BLOCK: tl.constexpr):
    """Each program sums its `per_program` contiguous elements: a read of HBM with nothing else."""
    base = X + tl.program_id(0).to(tl.int64) * per_program
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, per_program, BLOCK):
        acc += tl.load(base + start + tl.arange(0, BLOCK)).to(tl.float32)
    tl.store(OUT + tl.program_id(0), tl.sum(acc, 0))


def _reduction_tb_s(elements: int) -> float:
    """TB/s of the faster of `torch.sum` and `_sum_kernel` (2048 programs) over `elements` bf16 values,
    the best of three runs each."""
    import triton.testing
    buffer = torch.randn(elements, device="cuda", dtype=torch.bfloat16)
    programs = 2048
    partial = torch.empty(programs, device="cuda", dtype=torch.float32)

    def triton_sum():
        _sum_kernel[(programs,)](buffer, partial, buffer.numel() // programs, BLOCK=4096, num_warps=8,
                                 **COMPILE_OPTIONS)
    times = [triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median")
             for _ in range(3) for fn in (lambda: buffer.sum(dtype=torch.float32), triton_sum)]
    return elements * 2 / min(times) / 1e9


def read_ceiling_tb_s() -> float:
    """HBM read bandwidth as a plain reduction reaches it, over 4 GiB and over 16 GiB (where that fits):
    the suite's largest rows read 16 GiB of K and V, and at 1097615 cuDNN read 103% of the 4 GiB figure
    there (docs/performance.md, entry 64)."""
    best = _reduction_tb_s(2**31)
    with contextlib.suppress(torch.OutOfMemoryError):
        best = max(best, _reduction_tb_s(2**33))
    return best


def _inputs(shape: DecodeShape):
    """q (B, Hq, Nq, D), the contiguous cache (B, Hkv, Nk, D), and for a paged layout the same keys in
    blocks scattered by a random permutation with the block table."""
    q = torch.randn(shape.batch, shape.heads_q, shape.seqlen_q, shape.head_dim, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(shape.batch, shape.heads_kv, shape.seqlen_k, shape.head_dim, device="cuda",
                        dtype=torch.bfloat16) for _ in range(2))
    if shape.layout == "contiguous":
        return q, k, v, None
    size = int(shape.layout.removeprefix("paged"))
    per_seq = shape.seqlen_k // size
    table = torch.randperm(shape.batch * per_seq, device="cuda").view(shape.batch, per_seq).to(torch.int32)
    pages = []
    for x in (k, v):
        blocks = x.view(shape.batch, shape.heads_kv, per_seq, size, shape.head_dim).transpose(1, 2)
        paged = torch.empty(shape.batch * per_seq, shape.heads_kv, size, shape.head_dim, device="cuda",
                            dtype=x.dtype)
        paged[table.flatten().long()] = blocks.reshape(-1, shape.heads_kv, size, shape.head_dim)
        pages.append(paged)
    return q, pages[0], pages[1], table


def _calls(shape: DecodeShape, q, k, v, table) -> dict:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from ..kvcache import flash_attention_with_kvcache
    lengths = torch.full((shape.batch,), shape.seqlen_k, dtype=torch.int32, device="cuda")
    calls = {"flashtriton": lambda: flash_attention_with_kvcache(q, k, v, lengths, block_table=table,
                                                                 is_causal=shape.causal)}
    if table is None:
        gqa = shape.heads_q != shape.heads_kv
        for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("sdpa_flash", SDPBackend.FLASH_ATTENTION)):
            def call(backend=backend):
                with sdpa_kernel([backend]):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=shape.causal, enable_gqa=gqa)
            calls[name] = call
    return calls


def _median_ms(calls: dict, graphs: bool = False) -> dict[str, float]:
    """Each call's median ms over ROUNDS interleaved rounds of do_bench (or, with `graphs`,
    do_bench_cudagraph); NaN for a backend that refuses the shape (SDPA's "No available kernel")."""
    import triton.testing
    bench = triton.testing.do_bench_cudagraph if graphs else triton.testing.do_bench
    options = dict(rep=30, return_mode="median") if graphs else dict(warmup=10, rep=50, return_mode="median")
    times: dict[str, list[float]] = {name: [] for name in calls}
    with torch.no_grad():
        for _ in range(ROUNDS):
            for name, call in calls.items():
                try:
                    times[name].append(bench(call, **options))
                except Exception as error:  # the table shows "—", the log says why
                    print(f"{name}{' (CUDA graph)' if graphs else ''}: {type(error).__name__}: {str(error)[:200]}")
                    times[name].append(float("nan"))
    return {name: statistics.median(t) for name, t in times.items()}


def run_decode_suite(shapes: list[DecodeShape], progress=None) -> tuple[list[dict], float]:
    """The rows, and the read ceiling; `progress(rows, ceiling)` after each row (a run cut short keeps them)."""
    ceiling = read_ceiling_tb_s()
    rows = []
    for shape in shapes:
        q, k, v, table = _inputs(shape)
        calls = _calls(shape, q, k, v, table)
        ms = _median_ms(calls)
        graph_ms = _median_ms({n: c for n, c in calls.items() if n != "sdpa_flash"}, graphs=True)
        rows.append(dict(**asdict(shape), ms=ms, graph_ms=graph_ms,
                         tb_s={n: shape.bytes_moved / t / 1e9 for n, t in ms.items()},
                         graph_tb_s={n: shape.bytes_moved / t / 1e9 for n, t in graph_ms.items()},
                         tflop_s={n: shape.flops / t / 1e9 for n, t in ms.items()}))
        print(shape, {n: round(t, 4) for n, t in ms.items()}, "graphs", {n: round(t, 4) for n, t in graph_ms.items()},
              flush=True)
        del q, k, v, table
        if progress is not None:
            progress(rows, ceiling)
    return rows, ceiling


def prefill_row() -> dict:
    """Chunked prefill against the cache, and the dense forward at N = 4096 (flash_attention), causal."""
    from ..api import flash_attention
    from ..kvcache import flash_attention_with_kvcache
    shape = DecodeShape(PREFILL["batch"], PREFILL["heads_q"], PREFILL["heads_kv"], PREFILL["seqlen_k"],
                        PREFILL["head_dim"], PREFILL["seqlen_q"], causal=True)
    q, k, v, _ = _inputs(shape)
    dense = DecodeShape(4, 32, 32, 4096, 128, 4096, causal=True)
    qd, kd, vd = (torch.randn(4, 32, 4096, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    # Not SDPA: its is_causal aligns the mask top-left when Nq != Nk, so each query would see only the
    # first keys, far less work than the bottom-right prefill.
    calls = {"flashtriton": _calls(shape, q, k, v, None)["flashtriton"]}
    # One int length for every sequence, on a plain cache: the call takes the dense forward (kvcache.py).
    calls["flashtriton, int length"] = lambda: flash_attention_with_kvcache(q, k, v, shape.seqlen_k, is_causal=True)
    calls["flashtriton dense N=4096"] = lambda: flash_attention(qd, kd, vd, is_causal=True)
    ms = _median_ms(calls)
    flops = {name: (dense if "dense" in name else shape).flops for name in ms}
    return dict(**asdict(shape), ms=ms, tflop_s={n: flops[n] / t / 1e9 for n, t in ms.items()})


def _cell(row: dict, name: str, timing: str = "ms") -> str:
    t = row.get(timing, {}).get(name)
    if t is None or t != t:
        return "—"
    return f"{t:.3f} ({row['tb_s' if timing == 'ms' else 'graph_tb_s'][name]:.2f})"


def _ratio(row: dict, timing: str) -> str:
    ours, cudnn = row.get(timing, {}).get("flashtriton"), row.get(timing, {}).get("cudnn")
    return f"{cudnn / ours:.2f}" if ours and cudnn is not None and cudnn == cudnn else "—"


def _same_shape_contiguous(rows: list[dict]) -> dict:
    """{shape without its layout: the contiguous row}, for the paged rows' ratios."""
    return {tuple(v for k, v in r.items() if k in _SHAPE_KEYS): r for r in rows if r["layout"] == "contiguous"}


_SHAPE_KEYS = ("batch", "heads_q", "heads_kv", "seqlen_k", "head_dim", "seqlen_q", "causal")


def decode_table(rows: list[dict], ceiling: float) -> str:
    lines = ["| B | Hq/Hkv | Nk | D | Nq | cache | K+V MB | flashtriton ms (TB/s) | % of ceiling | cuDNN ms (TB/s) | "
             "sdpa_flash ms (TB/s) | vs cuDNN | flashtriton graph ms (TB/s) | % of ceiling | cuDNN graph ms | "
             "graph vs cuDNN | graph vs contiguous |", "|---" * 17 + "|"]
    contiguous = _same_shape_contiguous(rows)
    for r in rows:
        kv_mb = 2 * r["batch"] * r["heads_kv"] * r["seqlen_k"] * r["head_dim"] * 2 / 1e6
        graph = r.get("graph_tb_s", {}).get("flashtriton")
        base = contiguous.get(tuple(v for k, v in r.items() if k in _SHAPE_KEYS))
        versus = (f"{r['graph_ms']['flashtriton'] / base['graph_ms']['flashtriton']:.2f}"
                  if r["layout"] != "contiguous" and base is not None and "graph_ms" in r else "—")
        lines.append(f"| {r['batch']} | {r['heads_q']}/{r['heads_kv']} | {r['seqlen_k']} | {r['head_dim']} | "
                     f"{r['seqlen_q']} | {r['layout']} | {kv_mb:.0f} | {_cell(r, 'flashtriton')} | "
                     f"{100 * r['tb_s']['flashtriton'] / ceiling:.0f}% | {_cell(r, 'cudnn')} | "
                     f"{_cell(r, 'sdpa_flash')} | {_ratio(r, 'ms')} | {_cell(r, 'flashtriton', 'graph_ms')} | "
                     f"{'—' if graph is None else f'{100 * graph / ceiling:.0f}%'} | "
                     f"{_cell(r, 'cudnn', 'graph_ms')} | {_ratio(r, 'graph_ms')} | {versus} |")
    return "\n".join(lines)


def write_decode_results(out: Path, rows: list[dict], ceiling: float, prefill: dict | None, meta: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "decode.json").write_text(json.dumps(dict(meta=meta, read_ceiling_tb_s=ceiling, rows=rows,
                                                     prefill=prefill), indent=1))
    text = [f"# Decode on {meta.get('gpu')}", f"torch {meta.get('torch')}, triton {meta.get('triton')}, commit "
            f"{meta.get('commit')}, one run.", "",
            f"bf16, one query token (Nq = 1) unless said, every sequence Nk keys. Read ceiling measured in the same "
            f"run: {ceiling:.2f} TB/s (the fastest of `torch.sum` and a Triton reduction over 4 and 16 GiB). "
            "Bandwidth counts "
            "K and V once plus Q and O. `ms`: eager calls (`do_bench`, the host path included where it outlasts the L2 "
            "flush); `graph ms`: replayed from a CUDA graph (`do_bench_cudagraph`), the GPU time. cuDNN "
            "and sdpa_flash are PyTorch's SDPA backends on the contiguous cache with `enable_gqa`; they have no "
            "paged cache (—). vs cuDNN: cuDNN's ms / ours, above 1 means ours is faster. "
            "`python -m flashtriton bench --suite decode`.", "", decode_table(rows, ceiling)]
    if prefill is not None:
        text += ["", "## Chunked prefill", "",
                 f"Nq = {prefill['seqlen_q']} against Nk = {prefill['seqlen_k']} cached keys, B={prefill['batch']}, "
                 f"Hq/Hkv = {prefill['heads_q']}/{prefill['heads_kv']}, D={prefill['head_dim']}, causal "
                 "(bottom-right); "
                 "beside the dense causal forward at B=4, H=32, N=4096, D=128.", "",
                 "| call | ms | TFLOP/s |", "|---|---|---|"]
        # SDPA's cells of runs before 2026-12-02 (cuDNN at thousands of TFLOP/s): its is_causal aligned the mask
        # top-left, a different and much smaller problem, so they are left out.
        text += [f"| {name} | {t:.3f} | {prefill['tflop_s'][name]:.0f} |" if t == t else f"| {name} | no kernel | |"
                 for name, t in prefill["ms"].items() if name not in ("cudnn", "sdpa_flash")]
    (out / "decode.md").write_text("\n".join(text) + "\n")


def bench_decode(out: Path | None, batches: set[int] | None = None, head_dims: set[int] | None = None) -> int:
    from .bench import environment, warm_up_gpu
    warm_up_gpu()
    shapes = [s for s in decode_suite() if (batches is None or s.batch in batches)
              and (head_dims is None or s.head_dim in head_dims)]
    meta = environment()
    prefill = None  # first, then the rows, each written as it comes: a run cut short keeps what it measured
    with contextlib.suppress(torch.OutOfMemoryError):
        prefill = prefill_row()
    rows, ceiling = run_decode_suite(shapes, None if out is None else
                                     lambda rows, ceiling: write_decode_results(out, rows, ceiling, prefill, meta))
    print(decode_table(rows, ceiling))
    if prefill is not None:
        print(json.dumps(prefill["tflop_s"]))
    if out is not None:
        write_decode_results(out, rows, ceiling, prefill, meta)
        print(f"wrote {out}/decode.json, .md")
    return 0
