"""Benchmarks against the peers, and the correctness check that runs before any timing.

On a GPU every provider's output is checked against a float32 reference next to ours before it is timed;
times are `triton.testing.do_bench` medians on fresh random inputs, the providers timed in turn over
ROUNDS rounds (median of the rounds). FLOPs are counted as the
FlashAttention papers do: forward = 4 * B * Hq * Nq * Nk * D, halved when causal; backward = 2.5 x forward.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import itertools
import json
import os
import platform
import re
import statistics
import subprocess
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from ..api import flash_attention, flash_attention_varlen
from ..launch import last_choice
from ..reference import attention_ref
from ..testing import compare_with_reference, make_qkv
from .plotting import pyplot

BWD_FLOP_RATIO = 2.5  # backward does 2.5x the forward's matmul FLOPs (5 matmuls to 2)
DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


@dataclass(frozen=True)
class Shape:
    batch: int
    heads_q: int
    heads_kv: int
    seqlen_q: int
    seqlen_k: int
    head_dim: int
    causal: bool
    # the variants suite's options (flash_attention's keywords); the other suites leave them off
    window: tuple[int, int] = (-1, -1)
    softcap: float = 0.0
    alibi: bool = False
    varlen: tuple[int, ...] = ()  # a packed batch of these lengths (queries = keys): seqlen_* = the total

    @property
    def variant(self) -> str:
        """A short name for the options beyond the plain (or causal) attention; "" for none."""
        parts = [f"gqa{self.heads_q // self.heads_kv}" if self.heads_q != self.heads_kv else "",
                 f"window{self.window[0]},{self.window[1]}" if self.window != (-1, -1) else "",
                 f"softcap{self.softcap:g}" if self.softcap else "", "alibi" if self.alibi else "",
                 f"varlen{len(self.varlen)}" if self.varlen else ""]
        return "+".join(p for p in parts if p)

    @property
    def variant_kind(self) -> str:
        """The variant without its parameters (gqa, window, softcap, alibi, varlen; "plain" for none): the
        names that `bench --variants` selects by."""
        return re.sub(r"[\d,.]+", "", self.variant) or "plain"

    def flops(self, mode: str) -> float:
        """ANCHORS.md's count: 4·B·H·Nq·Nk·D, halved when causal; with a sliding window, 4·B·H·D times the
        (query, key) pairs that the band lets through."""
        if self.varlen:  # each sequence by itself
            fwd = sum(4.0 * self.heads_q * n * n * self.head_dim / (2 if self.causal else 1) for n in self.varlen)
        elif self.window == (-1, -1):
            fwd = 4.0 * self.batch * self.heads_q * self.seqlen_q * self.seqlen_k * self.head_dim
            fwd = fwd / 2 if self.causal else fwd
        else:
            fwd = 4.0 * self.batch * self.heads_q * self.head_dim * visible_pairs(
                self.seqlen_q, self.seqlen_k, self.causal, self.window)
        return {"fwd": fwd, "bwd": BWD_FLOP_RATIO * fwd, "fwd_bwd": (1 + BWD_FLOP_RATIO) * fwd}[mode]


def visible_pairs(seqlen_q: int, seqlen_k: int, causal: bool, window: tuple[int, int]) -> int:
    """How many (query, key) pairs a band lets through (query i sees keys i + d - left .. i + d + right)."""
    left, right = window
    if causal:
        right = 0 if right < 0 else min(right, 0)
    diag = seqlen_k - seqlen_q
    total = 0
    for i in range(seqlen_q):
        lo = 0 if left < 0 else max(0, i + diag - left)
        hi = seqlen_k - 1 if right < 0 else min(seqlen_k - 1, i + diag + right)
        total += max(0, hi - lo + 1)
    return total


@functools.cache
def alibi_slopes(heads: int, device) -> torch.Tensor:
    """ALiBi's geometric slopes, 2^(-8 (h + 1) / H), as the paper sets them. Cached: the timed calls run
    inside CUDA graph capture, where a copy from the host is not allowed."""
    return torch.tensor([2.0 ** (-8.0 * (h + 1) / heads) for h in range(heads)], device=device)


def article_suite() -> list[Shape]:
    """The article's table: B=4, H=8, D=64, N = 512..4096, causal and not."""
    return [Shape(4, 8, 8, n, n, 64, causal) for n in (512, 1024, 2048, 4096) for causal in (False, True)]


def paper_suite() -> list[Shape]:
    """The FlashAttention-2 paper's sweep: 16k tokens per batch (B = 16384 / N), H = 2048 / D."""
    return [Shape(16384 // n, 2048 // d, 2048 // d, n, n, d, causal)
            for d in (64, 128) for causal in (False, True) for n in (512, 1024, 2048, 4096, 8192, 16384)]


def cs336_suite() -> list[Shape]:
    """The CS336 assignment's leaderboard shape: B=1, H=16, N=16384, D=64, causal."""
    return [Shape(1, 16, 16, 16384, 16384, 64, True)]


def memory_suite() -> list[Shape]:
    """Peak memory of forward + backward at long contexts: the CS336 shape at N = 16k and 64k."""
    return [Shape(1, 16, 16, n, n, 64, True) for n in (16384, 65536)]


def variants_suite() -> list[Shape]:
    """Issue 5's variants at D=128: GQA (Hq=32, Hkv=8, 16k tokens), a 4096-wide causal sliding window at
    N=16k, softcap (50, as Gemma 2) and ALiBi at N=4096, and a packed batch of eight causal sequences
    (16k tokens), with the plain causal shapes alongside."""
    return [Shape(4, 32, 8, 4096, 4096, 128, causal) for causal in (False, True)] + [
        Shape(1, 16, 16, 16384, 16384, 128, True),
        Shape(1, 16, 16, 16384, 16384, 128, True, window=(4096, 0)),
        Shape(4, 16, 16, 4096, 4096, 128, True),
        Shape(4, 16, 16, 4096, 4096, 128, True, softcap=50.0),
        Shape(4, 16, 16, 4096, 4096, 128, True, alibi=True),
        Shape(1, 16, 16, 16384, 16384, 128, True, varlen=MIXED_LENGTHS),
    ]


MIXED_LENGTHS = (5000, 3000, 2048, 2000, 1500, 1024, 1000, 812)  # 16384 tokens in eight sequences


SUITES: dict[str, Callable[[], list[Shape]]] = {"article": article_suite, "paper": paper_suite,
                                                "cs336": cs336_suite, "memory": memory_suite,
                                                "variants": variants_suite}
DEFAULT_MODES = {"article": ["fwd"], "paper": ["fwd"], "cs336": ["fwd", "bwd", "fwd_bwd"], "memory": ["fwd_bwd"],
                 "variants": ["fwd", "bwd"]}


# ---------------------------------------------------------------------------------------------- providers

@dataclass(frozen=True)
class Provider:
    """`run(q, k, v, shape) -> o`, called inside `context()`; the context is entered once around all
    timed calls, so its own cost (sdpa_kernel's backend switch) stays out of the times. A provider that
    cannot run a shape's variant raises NotImplementedError (recorded as unavailable). `leaves()`: tensors
    of its own that its backward gives gradients to instead of q, k and v (copies in another layout); the
    timer drops their gradients before each call as it does q's, k's and v's, or the bwd mode's repeated
    backwards would add each call's gradients into the last one's (three more kernels, timed)."""
    run: Callable
    context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
    leaves: Callable[[], tuple] = tuple


def _slopes_for(shape: Shape, q: torch.Tensor) -> torch.Tensor | None:
    return alibi_slopes(shape.heads_q, q.device) if shape.alibi else None


def _flashtriton(q, k, v, shape: Shape):
    if shape.varlen:  # q, k, v: the (1, H, total, D) views of the packed batch (see run_suite)
        cu = _cu_seqlens(shape, q.device)
        o = flash_attention_varlen(*(x[0].transpose(0, 1) for x in (q, k, v)), cu, cu, max(shape.varlen),
                                   max(shape.varlen), is_causal=shape.causal, window_size=shape.window,
                                   softcap=shape.softcap, alibi_slopes=_slopes_for(shape, q))
        return o.transpose(0, 1)[None]
    return flash_attention(q, k, v, is_causal=shape.causal, window_size=shape.window, softcap=shape.softcap,
                           alibi_slopes=_slopes_for(shape, q))


def _forward_path(path: str) -> Callable[[], contextlib.AbstractContextManager]:
    """A provider context that forces flash_attention's forward path (launch/gluon_forward.py's
    FLASHTRITON_FORWARD) while the provider runs: "triton" or "gluon" (which still runs the Triton kernels
    for what the Gluon one does not take: the variants, D other than 64 and 128, GPUs other than sm_90)."""
    from ..launch.gluon_forward import FORWARD_PATH_VARIABLE
    return lambda: environment_variable(FORWARD_PATH_VARIABLE, path)


@contextlib.contextmanager
def environment_variable(variable: str, value: str):
    """`variable` set to `value` inside the block, then as it was. Only the one variable is touched:
    mock.patch.dict(os.environ) copies and restores every variable (a putenv each), 150 µs per call with
    35 of them, which the timed calls of small shapes then measured (docs/performance.md, entry 80)."""
    old = os.environ.get(variable)
    os.environ[variable] = value
    try:
        yield
    finally:
        if old is None:
            del os.environ[variable]
        else:
            os.environ[variable] = old


def _fa4() -> Provider:
    """FlashAttention-4 (`flash-attn-4` on PyPI: CuTe DSL kernels with a Hopper path), the fastest peer on
    the H200 (issue 21). It takes (B, N, H, D): the inputs are copied to that layout once per input tensor,
    outside the timing, and the output returned as a (B, H, N, D) view; the copies take the gradients
    (`leaves`). FLASHTRITON_FA4_SITE names a site directory to add first (its wheels unpacked there:
    ../shared/probes/fa4/README.md)."""
    state: dict = {}

    def run(q, k, v, shape: Shape):
        if "import" not in state:
            site_dir = os.environ.get("FLASHTRITON_FA4_SITE")
            if site_dir:
                import site
                site.addsitedir(site_dir)  # processes the cutlass wheels' .pth files, as an install would
            try:
                from flash_attn.cute import flash_attn_func
                state["import"] = flash_attn_func
            except ImportError as exc:
                state["import"] = exc
        if isinstance(state["import"], Exception):
            raise NotImplementedError(f"flash-attn-4 is not importable: {state['import']}")
        if shape.window != (-1, -1) or shape.softcap or shape.alibi or shape.varlen:
            raise NotImplementedError("the fa4 provider times plain and causal attention only")
        key = tuple((id(x), x.data_ptr(), x.shape, x._version) for x in (q, k, v))
        if state.get("key") != key:
            state["key"] = key
            state["inputs"] = tuple(x.detach().transpose(1, 2).contiguous().requires_grad_(x.requires_grad)
                                    for x in (q, k, v))
        for x in state["inputs"]:
            x.grad = None  # a call's gradients, not added to the last call's (the bwd mode's timer: `leaves`)
        out = state["import"](*state["inputs"], causal=shape.causal)
        return (out[0] if isinstance(out, tuple) else out).transpose(1, 2)
    return Provider(run, leaves=lambda: state.get("inputs", ()))


@functools.cache
def _cu_seqlens(shape: Shape, device) -> torch.Tensor:  # cached for graph capture, as alibi_slopes
    return torch.tensor([0, *itertools.accumulate(shape.varlen)], dtype=torch.int32, device=device)


def _sdpa(backend: str | None = None) -> Provider:
    def context():
        if backend is None:
            return contextlib.nullcontext()
        from torch.nn.attention import SDPBackend, sdpa_kernel
        return sdpa_kernel([getattr(SDPBackend, backend)])

    def run(q, k, v, shape: Shape):
        if shape.window != (-1, -1) or shape.softcap or shape.alibi or shape.varlen:
            raise NotImplementedError("SDPA has no sliding window, softcap, ALiBi or packed batch without a "
                                      "dense mask")
        return F.scaled_dot_product_attention(q, k, v, is_causal=shape.causal,
                                              enable_gqa=shape.heads_q != shape.heads_kv)
    return Provider(run, context)


def _flex() -> Provider:
    """FlexAttention compiled by torch.compile: a block mask (built once per shape) for causal masks and
    windows, a score_mod for softcap and ALiBi, enable_gqa for grouped heads."""
    state: dict = {}

    def run(q, k, v, shape: Shape):
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        if "compiled" not in state:
            # One static kernel per shape, as a model with fixed shapes gets; the suites have more shapes
            # than dynamo's default recompile limit (8), past which it would fall back to eager attention.
            import torch._dynamo
            for limit in ("recompile_limit", "cache_size_limit"):
                if hasattr(torch._dynamo.config, limit):
                    setattr(torch._dynamo.config, limit, max(256, getattr(torch._dynamo.config, limit)))
            state["compiled"] = torch.compile(flex_attention, dynamic=False)
        key = (shape, q.device)
        if key not in state:
            state[key] = _flex_mods(shape, q, create_block_mask)
        block_mask, score_mod = state[key]
        return state["compiled"](q, k, v, score_mod=score_mod, block_mask=block_mask,
                                 enable_gqa=shape.heads_q != shape.heads_kv)
    return Provider(run)


def _flex_mods(shape: Shape, q: torch.Tensor, create_block_mask) -> tuple:
    """(block mask or None, score_mod or None) with our semantics: bands aligned bottom-right."""
    diag = shape.seqlen_k - shape.seqlen_q
    left, right = shape.window
    if shape.causal:
        right = 0 if right < 0 else min(right, 0)
    block_mask = None
    document = None
    if shape.varlen:  # a packed batch: one document per sequence, each its own square (queries = keys)
        document = torch.repeat_interleave(torch.arange(len(shape.varlen), device=q.device),
                                           torch.tensor(shape.varlen, device=q.device))
    if left >= 0 or right >= 0 or document is not None:
        def band(b, h, q_idx, kv_idx):
            visible = kv_idx >= 0
            if document is not None:
                visible = visible & (document[q_idx] == document[kv_idx])
            if right >= 0:
                visible = visible & (kv_idx <= q_idx + diag + right)
            if left >= 0:
                visible = visible & (kv_idx >= q_idx + diag - left)
            return visible
        block_mask = create_block_mask(band, None, None, shape.seqlen_q, shape.seqlen_k, device=q.device)
    score_mod = None
    if shape.softcap or shape.alibi:
        cap, slopes = shape.softcap, _slopes_for(shape, q)

        def score_mod(score, b, h, q_idx, kv_idx):
            if cap:
                score = cap * torch.tanh(score / cap)
            if slopes is not None:
                score = score - slopes[h] * (q_idx + diag - kv_idx).abs()
            return score
    return block_mask, score_mod


PROVIDERS: dict[str, Provider] = {
    "flashtriton": Provider(_flashtriton),
    "sdpa": _sdpa(),  # whatever PyTorch dispatches to by default (cuDNN on Hopper with torch >= 2.5)
    "sdpa_flash": _sdpa("FLASH_ATTENTION"),  # Tri Dao's FlashAttention-2 CUDA kernels
    "sdpa_cudnn": _sdpa("CUDNN_ATTENTION"),
    "flex": _flex(),  # PyTorch's own Triton-generated attention
    "sdpa_math": _sdpa("MATH"),  # plain attention: materialises the (N, N) scores
    # opt-in (--providers): flash_attention with its forward path forced to the Triton kernels or to the
    # FlashAttention-3-style Gluon kernel where it applies ("flashtriton" chooses); FlashAttention-4, where
    # its wheels are importable
    "flashtriton_triton": Provider(_flashtriton, _forward_path("triton")),
    "flashtriton_gluon": Provider(_flashtriton, _forward_path("gluon")),
    "fa4": _fa4(),
}


def sdpa_default_backend(q, k, v, causal) -> str:
    """Which kernel plain SDPA launches, read off the profiler's kernel names."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        torch.cuda.synchronize()
    names = " ".join(e.key for e in prof.key_averages()).lower()
    for marker, backend in (("cudnn", "cuDNN"), ("flash", "FlashAttention-2"), ("fmha", "mem-efficient"),
                            ("cutlass", "mem-efficient")):
        if marker in names:
            return backend
    return "math (unfused)"


# ------------------------------------------------------------------------------------------------ timing

@dataclass
class Row:
    provider: str
    suite: str
    B: int
    Hq: int
    Hkv: int
    Nq: int
    Nk: int
    D: int
    dtype: str
    causal: bool
    mode: str
    ms: float
    tflops: float
    max_err_vs_fp32: float | None = None
    spread: float = 0.0  # (max - min) / median of the ROUNDS interleaved timings
    ms_graph: float | None = None  # forward replayed from a CUDA graph: the GPU's time without launch overhead
    peak_mem_mb: float | None = None  # fwd_bwd: memory one call allocates at its peak, beyond q, k, v, dO
    variant: str = ""  # Shape.variant: GQA, window, softcap, ALiBi (the variants suite)


def _time(fn: Callable[[], object], grad_to_none=None) -> float:
    import triton.testing
    return triton.testing.do_bench(fn, warmup=25, rep=100, grad_to_none=grad_to_none, return_mode="median")


def _time_graph(fn: Callable[[], object]) -> float:
    import triton.testing
    return triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median")


def warm_up_gpu(seconds: float = 2.0) -> None:
    """Run matmuls until the clocks have left idle: the first timings otherwise run at a fraction of them."""
    import time
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(10):
            a @ a
        torch.cuda.synchronize()


def time_provider(name: str, shape: Shape, mode: str, q, k, v, graph: bool = False) -> float:
    """Median ms of one call as the user makes it (eager: Python and launch overhead included), or with
    `graph`, of the forward replayed from a CUDA graph (what the GPU itself spends)."""
    return provider_timer(name, shape, mode, q, k, v, graph)()


def provider_timer(name: str, shape: Shape, mode: str, q, k, v, graph: bool = False) -> Callable[[], float]:
    """A function that times one call of `name` (time_provider) each time it is called. The bwd mode's
    forward runs once, here; its graph is kept for the repeated backwards."""
    provider = PROVIDERS[name]
    fn = provider.run
    if mode == "fwd":
        def timed():
            with provider.context(), torch.no_grad():
                return (_time_graph if graph else _time)(lambda: fn(q, k, v, shape))
        return timed
    with provider.context():
        o = fn(q, k, v, shape)
    do = torch.randn_like(o)
    to_none = [q, k, v, *provider.leaves()]  # (the leaves exist once the provider has run)

    def timed():
        with provider.context():
            if mode == "bwd":
                return _time(lambda: o.backward(do, retain_graph=True), grad_to_none=to_none)
            return _time(lambda: fn(q, k, v, shape).backward(do), grad_to_none=to_none)
    return timed


# Each (shape, mode) times every provider once per round, ROUNDS rounds, and keeps the median. Timing one
# provider after another instead let the clocks' drift land on whoever ran last or first: our backward's
# two back-to-back timings differed by up to 8% where sdpa_flash's did not.
ROUNDS = 3


def peak_memory_mb(name: str, shape: Shape, q, k, v) -> float:
    """MiB that one forward + backward allocates at its peak on top of what exists before it (the inputs
    and dO): activations, saved tensors, workspaces and the gradients."""
    provider = PROVIDERS[name]
    with provider.context():
        do = torch.randn_like(q)
        for x in (q, k, v):
            x.grad = None
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        provider.run(q, k, v, shape).backward(do)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
        for x in (q, k, v):
            x.grad = None
    return peak / 2**20


def _reference(q, k, v, shape: Shape) -> tuple[torch.Tensor, tuple]:
    """A float32 reference output and the index of the part of an output it stands for: all of it for
    plain and causal attention (SDPA in float32), the first batch element's first and last query heads for
    the variants (plain attention in float32 materialises N x N scores per head)."""
    heads = sorted({0, shape.heads_q - 1})
    kv_heads = [h // (shape.heads_q // shape.heads_kv) for h in heads]
    slopes = _slopes_for(shape, q)
    slopes = None if slopes is None else slopes[heads]
    if shape.varlen:
        parts, start = [], 0
        for n in shape.varlen:
            rows = slice(start, start + n)
            out, _ = attention_ref(q[:, heads, rows].float(), k[:, kv_heads, rows].float(),
                                   v[:, kv_heads, rows].float(), is_causal=shape.causal, upcast=False,
                                   window_size=shape.window, softcap=shape.softcap, alibi_slopes=slopes)
            parts.append(out)
            start += n
        return torch.cat(parts, dim=2), (slice(None), heads)
    if shape.window == (-1, -1) and not shape.softcap and not shape.alibi:
        ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=shape.causal,
                                             enable_gqa=shape.heads_q != shape.heads_kv)
        return ref, (slice(None),)
    ref, _ = attention_ref(q[:1, heads].float(), k[:1, kv_heads].float(), v[:1, kv_heads].float(),
                           is_causal=shape.causal, upcast=False, window_size=shape.window, softcap=shape.softcap,
                           alibi_slopes=slopes)
    return ref, (slice(0, 1), heads)


def run_suite(suite: str, providers: list[str], modes: list[str], dtype=torch.bfloat16,
              log: Callable[[str], None] = print, keep: Callable[[Shape], bool] = lambda shape: True,
              unavailable: list[dict] | None = None) -> list[Row]:
    """Time every shape of `suite` that `keep` accepts. A provider that cannot run a shape (unsupported,
    or out of memory, as plain attention is at long contexts) is logged and, if given, noted in
    `unavailable` instead of timed."""
    warm_up_gpu()
    rows = []

    def skip(name: str, shape: Shape, mode: str, exc: Exception) -> None:
        reason = str(exc).splitlines()[0][:200]
        log(f"  {name} unavailable for {shape} ({mode}): {reason}")
        if unavailable is not None:
            unavailable.append({"provider": name, "mode": mode, **asdict(shape), "reason": reason})
        torch.cuda.empty_cache()

    for shape in filter(keep, SUITES[suite]()):
        q, k, v = make_qkv(shape.batch, shape.heads_q, shape.heads_kv, shape.seqlen_q, shape.seqlen_k,
                           shape.head_dim, dtype, "cuda")
        with torch.no_grad():  # check every provider against a float32 reference before timing it
            ref, part = _reference(q, k, v, shape)
            errors = {}
            for name in providers:
                try:
                    with PROVIDERS[name].context():
                        out = PROVIDERS[name].run(q, k, v, shape)
                    errors[name] = (out[part].float() - ref).abs().max().item()
                    del out
                    if name == "flashtriton":
                        log(f"  {shape}: flashtriton runs {last_choice('forward')}")
                except RuntimeError as exc:  # unsupported here, or out of memory
                    skip(name, shape, "check", exc)
            del ref
        for mode in modes:
            timers = {}
            for name in errors:
                try:
                    timers[name] = provider_timer(name, shape, mode, q, k, v)
                except torch.cuda.OutOfMemoryError as exc:
                    skip(name, shape, mode, exc)
            times = {name: [] for name in timers}
            for _ in range(ROUNDS):  # interleaved, so that a drift of the clocks hits every provider alike
                for name in list(timers):
                    try:
                        times[name].append(timers[name]())
                    except torch.cuda.OutOfMemoryError as exc:
                        skip(name, shape, mode, exc)
                        del timers[name]
            del timers  # the bwd mode's graphs
            for name in (n for n in errors if n in times and len(times[n]) == ROUNDS):
                try:
                    ms_graph = time_provider(name, shape, mode, q, k, v, graph=True) if mode == "fwd" else None
                    peak = peak_memory_mb(name, shape, q, k, v) if mode == "fwd_bwd" else None
                except torch.cuda.OutOfMemoryError as exc:
                    skip(name, shape, mode, exc)
                    continue
                ms = statistics.median(times[name])
                rows.append(Row(name, suite, shape.batch, shape.heads_q, shape.heads_kv, shape.seqlen_q,
                                shape.seqlen_k, shape.head_dim, DTYPE_NAMES[dtype], shape.causal, mode, ms,
                                shape.flops(mode) / ms / 1e9, errors[name], (max(times[name]) - min(times[name])) / ms,
                                ms_graph, peak, shape.variant))
                notes = f" graph {ms_graph:.3f} ms" if ms_graph is not None else ""
                notes += f" peak {peak:.0f} MiB" if peak is not None else ""
                notes += f" [{last_choice('backward')}]" if name == "flashtriton" and mode != "fwd" else ""
                log(f"  {name:<12} {mode:<7} N={shape.seqlen_q:<6} causal={shape.causal!s:<5} "
                    f"{ms:8.3f} ms (+-{50 * rows[-1].spread:.1f}%){notes} {rows[-1].tflops:7.1f} TFLOP/s  "
                    f"err {errors[name]:.1e}")
    return rows


def check_correctness(device: str, sizes: list[tuple[int, int]], head_dim: int, dtype=torch.bfloat16,
                      log: Callable[[str], None] = print) -> bool:
    """O, L, dQ, dK, dV against float64 for a few odd shapes, both masks. Returns True if all pass."""
    ok = True
    for seqlen_q, seqlen_k in sizes:
        for causal in (False, True):
            q, k, v = make_qkv(1, 2, 2, seqlen_q, seqlen_k, head_dim, dtype, device)
            checks = compare_with_reference(
                lambda q, k, v, causal=causal: flash_attention(q, k, v, is_causal=causal, return_lse=True),
                q, k, v, causal)
            passed = all(c.ok for c in checks)
            ok &= passed
            worst = max(checks, key=lambda c: c.err / max(c.allowed, 1e-30))
            log(f"  Nq={seqlen_q:<5} Nk={seqlen_k:<5} causal={causal!s:<5} {DTYPE_NAMES[dtype]}: "
                f"{'ok  ' if passed else 'FAIL'} worst {worst}")
    return ok


# ------------------------------------------------------------------------------------------------ output

def environment() -> dict:
    import triton
    commit = os.environ.get("FLASHTRITON_COMMIT")
    if commit is None:
        with contextlib.suppress(OSError, subprocess.CalledProcessError):
            commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                    check=True, cwd=Path(__file__).parent).stdout.strip()
    return {
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else platform.processor() or "cpu",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "commit": commit,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def article_table(rows: list[Row], baseline: str = "sdpa") -> str:
    """The article's table: ours against one baseline, forward, one line per (N, causal). The last two
    columns replay each forward from a CUDA graph: the GPU's own time, without Python and launch cost."""
    by_key = {(r.provider, r.Nq, r.causal, r.mode): r for r in rows}
    lines = ["| N | causal | ours ms | SDPA ms | ours TFLOP/s | SDPA TFLOP/s | % of SDPA | ours ms (graph) | "
             "SDPA ms (graph) |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.provider != "flashtriton" or r.mode != "fwd":
            continue
        base = by_key.get((baseline, r.Nq, r.causal, "fwd"))
        if base is None:
            continue
        graphs = " | ".join(f"{x.ms_graph:.3f}" if x.ms_graph is not None else "-" for x in (r, base))
        lines.append(f"| {r.Nq} | {'yes' if r.causal else 'no'} | {r.ms:.3f} | {base.ms:.3f} | {r.tflops:.0f} | "
                     f"{base.tflops:.0f} | {100 * base.ms / r.ms:.0f}% | {graphs} |")
    return "\n".join(lines)


def provider_table(rows: list[Row]) -> str:
    """TFLOP/s of every provider, one line per (shape, mode), with our ratio to each peer."""
    providers = list(dict.fromkeys(r.provider for r in rows))
    keys = list(dict.fromkeys((r.B, r.Hq, r.Nq, r.D, r.causal, r.mode, r.variant) for r in rows))
    by_key = {(r.B, r.Hq, r.Nq, r.D, r.causal, r.mode, r.variant, r.provider): r for r in rows}
    peers = [p for p in providers if p != "flashtriton"]
    variants = any(r.variant for r in rows)  # a column only where a suite has them
    lines = ["| B | H | N | D | causal | " + ("variant | " if variants else "") + "mode | "
             + " | ".join(providers) + " | " + " | ".join(f"ours/{p}" for p in peers) + " |"]
    lines.append("|" + "---|" * (6 + variants + len(providers) + len(peers)))
    for key in keys:
        cells = [by_key.get((*key, p)) for p in providers]
        ours = by_key.get((*key, "flashtriton"))
        ratios = [f"{ours.tflops / peer.tflops:.2f}" if ours and peer else "-"
                  for peer in (by_key.get((*key, p)) for p in peers)]
        b, h, n, d, causal, mode, variant = key
        lines.append(f"| {b} | {h} | {n} | {d} | {'yes' if causal else 'no'} | "
                     + (f"{variant or 'plain'} | " if variants else "") + f"{mode} | "
                     + " | ".join(f"{c.tflops:.0f}" if c else "-" for c in cells) + " | " + " | ".join(ratios) + " |")
    return "\n".join(lines)


def _out_of_memory(unavailable: list[dict]) -> list[dict]:
    """The entries of `unavailable` that ran out of memory (others lack a variant, e.g.)."""
    return [u for u in unavailable if "out of memory" in u["reason"].lower()]


def has_memory_figures(rows: list[Row], unavailable: list[dict] = ()) -> bool:
    """Whether a memory table has anything to show: a measured peak, or a provider that ran out of memory."""
    return any(r.peak_mem_mb is not None for r in rows) or bool(_out_of_memory(unavailable))


def memory_table(rows: list[Row], unavailable: list[dict] = ()) -> str:
    """Peak extra memory of forward + backward per provider (MiB), one line per shape; '-' where a
    provider did not run and 'OOM' where it ran out of memory."""
    mem = [r for r in rows if r.peak_mem_mb is not None]
    providers = list(dict.fromkeys([r.provider for r in mem] + [u["provider"] for u in unavailable]))
    keys = list(dict.fromkeys((r.B, r.Hq, r.Nq, r.D, r.causal) for r in mem))
    keys += [k for k in dict.fromkeys((u["batch"], u["heads_q"], u["seqlen_q"], u["head_dim"], u["causal"])
                                      for u in unavailable) if k not in keys]
    peaks = {(r.B, r.Hq, r.Nq, r.D, r.causal, r.provider): r.peak_mem_mb for r in mem}
    oom = {(u["batch"], u["heads_q"], u["seqlen_q"], u["head_dim"], u["causal"], u["provider"])
           for u in _out_of_memory(unavailable)}
    lines = ["| B | H | N | D | causal | " + " | ".join(providers) + " |", "|" + "---|" * (5 + len(providers))]
    for key in keys:
        cells = [f"{peaks[(*key, p)]:.0f}" if (*key, p) in peaks else "OOM" if (*key, p) in oom else "-"
                 for p in providers]
        b, h, n, d, causal = key
        lines.append(f"| {b} | {h} | {n} | {d} | {'yes' if causal else 'no'} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(rows: list[Row], path: Path, title: str) -> bool:
    """TFLOP/s against N per provider, one panel per (head dim, causal, mode). Needs matplotlib."""
    plt = pyplot()
    if plt is None:
        return False
    panels = list(dict.fromkeys((r.D, r.causal, r.mode, r.variant) for r in rows))
    columns = min(4, len(panels))
    nrows = -(-len(panels) // columns)
    fig, axes = plt.subplots(nrows, columns, figsize=(4.5 * columns, 3.8 * nrows), squeeze=False)
    for ax, (d, causal, mode, variant) in zip(axes.flat, panels, strict=False):
        for provider in dict.fromkeys(r.provider for r in rows):
            pts = sorted((r.Nq, r.tflops) for r in rows
                         if (r.D, r.causal, r.mode, r.variant, r.provider) == (d, causal, mode, variant, provider))
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=provider)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("sequence length N")
        ax.set_ylabel("TFLOP/s")
        ax.set_title(f"D={d}, {mode}, {'causal' if causal else 'non-causal'}{', ' + variant if variant else ''}",
                     fontsize=9)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    axes[0][0].legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def _row_key(row: dict) -> tuple:
    return (*(row[k] for k in ("provider", "B", "Hq", "Hkv", "Nq", "Nk", "D", "dtype", "causal", "mode")),
            row.get("variant", ""))


def merge_rows(path: Path, rows: list[Row], meta: dict) -> list[Row]:
    """`rows` plus the rows of an earlier <suite>.json at `path` that they do not replace (a suite timed in
    parts, e.g. one head dim per device call). Each earlier run's meta is kept under meta["merged"]."""
    if not path.exists():
        return rows
    old = json.loads(path.read_text())
    new_keys = {_row_key(asdict(r)) for r in rows}
    kept = [Row(**r) for r in old["rows"] if _row_key(r) not in new_keys]
    if kept:  # the runs behind the kept rows, after any already listed
        earlier = old["meta"].pop("merged", [])
        meta["merged"] = meta.get("merged", []) + earlier + [dict(old["meta"], rows=len(kept))]
    return kept + rows


def write_results(out_dir: Path, suite: str, rows: list[Row], meta: dict, merge: bool = False) -> list[Row]:
    """<suite>.json, .md and .png in out_dir; with `merge`, earlier rows there that `rows` do not replace
    stay. Returns the rows written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    if merge:
        rows = merge_rows(out_dir / f"{suite}.json", rows, meta)
    (out_dir / f"{suite}.json").write_text(json.dumps({"meta": meta, "rows": [asdict(r) for r in rows]}, indent=1))
    md = [f"# `{suite}` suite on {meta['gpu']}",
          f"torch {meta['torch']}, triton {meta['triton']}, commit {meta['commit']}, {meta['date']}.", ""]
    merged = meta.get("merged", [])
    if merged:  # say so where the table is read, not only in the JSON
        commits = ", ".join(dict.fromkeys(m["commit"] for m in merged))
        md += [f"**Not one run**: beside this run's rows are rows of {len(merged)} earlier runs (commits {commits}; "
               "`meta.merged` in the JSON lists each). For a table from one run: "
               f"`bash benchmarks/h200.sh {suite}` without MERGE.", ""]
    if suite == "article":
        md += ["Forward, B=4, H=8, D=64, bf16; SDPA is plain `F.scaled_dot_product_attention` "
               f"({meta.get('sdpa_backend', '?')} on this GPU).", "", article_table(rows), ""]
    md += ["TFLOP/s of every provider:", "", provider_table(rows), ""]
    if has_memory_figures(rows, meta.get("unavailable", [])):
        md += ["Peak memory of one forward + backward beyond its inputs (MiB; `torch.cuda.max_memory_allocated`):",
               "", memory_table(rows, meta.get("unavailable", [])), ""]
    (out_dir / f"{suite}.md").write_text("\n".join(md))
    plot(rows, out_dir / f"{suite}.png", f"{suite} suite, {meta['gpu']}")
    return rows
