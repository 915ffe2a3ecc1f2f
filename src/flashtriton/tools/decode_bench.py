"""The `decode` suite: one (or a few) query tokens per sequence against a KV cache, bf16 (GPU only).

Decoding reads K and V once and does almost no arithmetic, so its limit is HBM bandwidth: each row
reports ms and the achieved bandwidth (bytes of K and V read, plus Q and O, over the time) beside a read
ceiling measured in the same run (`torch.sum` over a 4 GiB buffer), for flashtriton's
`flash_attention_with_kvcache` and for PyTorch's SDPA backends cuDNN and FlashAttention-2 (`sdpa_flash`),
which take the contiguous cache (B, H, N, D) with `enable_gqa` and have no paged cache: their paged cells
are empty. One chunked-prefill row (Nq = 512 against 16k cached keys, causal) is reported in TFLOP/s
beside the dense forward at N = 4096.

Timing: triton.testing.do_bench medians (L2 flushed before each call), ROUNDS interleaved rounds.
"""

from __future__ import annotations

import contextlib
import json
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

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
    for head_dim in (64, 128):
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


def read_ceiling_tb_s() -> float:
    """HBM read bandwidth as a plain reduction reaches it: the best of three torch.sum over 4 GiB."""
    import triton.testing
    buffer = torch.randn(2**31, device="cuda", dtype=torch.bfloat16)
    times = [triton.testing.do_bench(lambda: buffer.sum(dtype=torch.float32), warmup=10, rep=50,
                                     return_mode="median") for _ in range(3)]
    return buffer.numel() * 2 / min(times) / 1e9


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


def _median_ms(calls: dict) -> dict[str, float]:
    """Each call's median ms over ROUNDS interleaved rounds of do_bench; NaN for a backend that refuses the
    shape (SDPA's "No available kernel")."""
    import triton.testing
    times: dict[str, list[float]] = {name: [] for name in calls}
    with torch.no_grad():
        for _ in range(ROUNDS):
            for name, call in calls.items():
                try:
                    times[name].append(triton.testing.do_bench(call, warmup=10, rep=50, return_mode="median"))
                except RuntimeError:
                    times[name].append(float("nan"))
    return {name: statistics.median(t) for name, t in times.items()}


def run_decode_suite(shapes: list[DecodeShape]) -> tuple[list[dict], float]:
    ceiling = read_ceiling_tb_s()
    rows = []
    for shape in shapes:
        q, k, v, table = _inputs(shape)
        calls = _calls(shape, q, k, v, table)
        ms = _median_ms(calls)
        rows.append(dict(**asdict(shape), ms=ms, tb_s={n: shape.bytes_moved / t / 1e9 for n, t in ms.items()},
                         tflop_s={n: shape.flops / t / 1e9 for n, t in ms.items()}))
        print(shape, {n: round(t, 4) for n, t in ms.items()}, flush=True)
        del q, k, v, table
    return rows, ceiling


def prefill_row() -> dict:
    """Chunked prefill against the cache, and the dense forward at N = 4096 (flash_attention), causal."""
    from ..api import flash_attention
    shape = DecodeShape(PREFILL["batch"], PREFILL["heads_q"], PREFILL["heads_kv"], PREFILL["seqlen_k"],
                        PREFILL["head_dim"], PREFILL["seqlen_q"], causal=True)
    q, k, v, _ = _inputs(shape)
    dense = DecodeShape(4, 32, 32, 4096, 128, 4096, causal=True)
    qd, kd, vd = (torch.randn(4, 32, 4096, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    calls = _calls(shape, q, k, v, None)
    calls["flashtriton dense N=4096"] = lambda: flash_attention(qd, kd, vd, is_causal=True)
    ms = _median_ms(calls)
    flops = {name: (dense if "dense" in name else shape).flops for name in ms}
    return dict(**asdict(shape), ms=ms, tflop_s={n: flops[n] / t / 1e9 for n, t in ms.items()})


def _cell(row: dict, name: str) -> str:
    t = row["ms"].get(name)
    if t is None or t != t:
        return "—"
    return f"{t:.3f} ({row['tb_s'][name]:.2f})"


def decode_table(rows: list[dict], ceiling: float) -> str:
    lines = ["| B | Hq/Hkv | Nk | D | Nq | cache | K+V MB | flashtriton ms (TB/s) | % of ceiling | cuDNN ms (TB/s) | "
             "sdpa_flash ms (TB/s) | vs cuDNN |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ours = r["ms"]["flashtriton"]
        cudnn = r["ms"].get("cudnn")
        ratio = f"{cudnn / ours:.2f}" if cudnn is not None and cudnn == cudnn else "—"
        kv_mb = 2 * r["batch"] * r["heads_kv"] * r["seqlen_k"] * r["head_dim"] * 2 / 1e6
        lines.append(f"| {r['batch']} | {r['heads_q']}/{r['heads_kv']} | {r['seqlen_k']} | {r['head_dim']} | "
                     f"{r['seqlen_q']} | {r['layout']} | {kv_mb:.0f} | {_cell(r, 'flashtriton')} | "
                     f"{100 * r['tb_s']['flashtriton'] / ceiling:.0f}% | {_cell(r, 'cudnn')} | "
                     f"{_cell(r, 'sdpa_flash')} | {ratio} |")
    return "\n".join(lines)


def write_decode_results(out: Path, rows: list[dict], ceiling: float, prefill: dict | None, meta: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "decode.json").write_text(json.dumps(dict(meta=meta, read_ceiling_tb_s=ceiling, rows=rows,
                                                     prefill=prefill), indent=1))
    text = [f"# Decode on {meta.get('gpu')}", f"torch {meta.get('torch')}, triton {meta.get('triton')}, commit "
            f"{meta.get('commit')}, one run.", "",
            f"bf16, one query token (Nq = 1) unless said, every sequence Nk keys. Read ceiling measured in the same "
            f"run: {ceiling:.2f} TB/s (`torch.sum` over 4 GiB). Bandwidth counts K and V once plus Q and O. cuDNN "
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
        text += [f"| {name} | {t:.3f} | {prefill['tflop_s'][name]:.0f} |" if t == t else f"| {name} | no kernel | |"
                 for name, t in prefill["ms"].items()]
    (out / "decode.md").write_text("\n".join(text) + "\n")


def bench_decode(out: Path | None, batches: set[int] | None = None, head_dims: set[int] | None = None) -> int:
    from .bench import environment, warm_up_gpu
    warm_up_gpu()
    shapes = [s for s in decode_suite() if (batches is None or s.batch in batches)
              and (head_dims is None or s.head_dim in head_dims)]
    rows, ceiling = run_decode_suite(shapes)
    meta = environment()
    if out is not None:  # written now and again with the prefill row, so that a failure there keeps the suite
        write_decode_results(out, rows, ceiling, None, meta)
    prefill = None
    with contextlib.suppress(torch.OutOfMemoryError):
        prefill = prefill_row()
    print(decode_table(rows, ceiling))
    if prefill is not None:
        print(json.dumps(prefill["tflop_s"]))
    if out is not None:
        write_decode_results(out, rows, ceiling, prefill, meta)
        print(f"wrote {out}/decode.json, .md")
    return 0
