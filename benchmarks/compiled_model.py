"""A whole model, eager and under torch.compile: a nanoGPT-style GPT whose attention calls
F.scaled_dot_product_attention, run as it is (PyTorch's SDPA) and, unchanged, under
flashtriton.sdpa_override(). A training step (forward, backward of the loss, no optimizer) per call, bf16.

A graph holding one attention call measures torch.compile's fixed cost per call more than the
attention (benchmarks/compiled.py); in a model that cost is paid once per graph. Timing: back-to-back
steps, wall time per step of 20 steps after a synchronize, median of 5, taken once per round, three
rounds interleaved over (attention, way of calling).

    PYTHONPATH=src python benchmarks/compiled_model.py [--seqlens 1024,4096] [--out DIR]
    PYTHONPATH=src TRITON_INTERPRET=1 python benchmarks/compiled_model.py --device cpu --tiny   # a smoke run
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import flashtriton

ROUNDS = 3
WAYS = ("eager", "compiled", "reduce-overhead")


class Block(nn.Module):
    """nanoGPT's block: pre-norm attention (F.scaled_dot_product_attention, causal) and MLP."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x):
        batch, seqlen, width = x.shape
        q, k, v = (t.view(batch, seqlen, self.heads, width // self.heads).transpose(1, 2)
                   for t in self.qkv(self.norm1(x)).split(width, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(batch, seqlen, width))
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    def __init__(self, layers: int, width: int, heads: int, vocab: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _step(model: GPT, way: str):
    def loss_of(tokens):
        logits = model(tokens)
        return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), tokens[:, 1:].flatten())
    body = loss_of if way == "eager" else torch.compile(loss_of, fullgraph=True,
                                                         mode="reduce-overhead" if way != "compiled" else None)

    def step(tokens):
        if way == "reduce-overhead":
            torch.compiler.cudagraph_mark_step_begin()
        body(tokens).backward()
        model.zero_grad(set_to_none=True)
    return step


def _timer(attention: str, way: str, tokens, config: dict, device: str):
    torch.manual_seed(0)
    model = GPT(**config).to(device=device, dtype=torch.bfloat16 if device == "cuda" else torch.float32)
    step = _step(model, way)
    context = flashtriton.sdpa_override if attention == "flashtriton" else contextlib.nullcontext
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def timed(steps: int = 20, repeats: int = 5) -> float:
        per_step = []
        with context():
            for _ in range(repeats):
                sync()
                start = time.perf_counter()
                for _ in range(steps):
                    step(tokens)
                sync()
                per_step.append((time.perf_counter() - start) / steps * 1e3)
        return statistics.median(per_step)
    with context():
        for _ in range(3):  # compile, record the graphs, settle
            step(tokens)
    sync()
    timed.routed = None
    if device == "cuda":  # which attention kernels one step ran: ours are Triton's attn_* kernels
        with context(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
            step(tokens)
            sync()
        timed.routed = any(event.name.startswith("attn_") for event in profile.events())
    return timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seqlens", default="1024,4096")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--tiny", action="store_true", help="2 layers of width 32: a smoke run (CPU)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    config = (dict(layers=2, width=32, heads=2, vocab=64) if args.tiny
              else dict(layers=args.layers, width=1024, heads=16, vocab=32768))
    ways = ("eager",) if args.device != "cuda" else WAYS  # torch.compile of the interpreter's CPU run: too slow
    rows = []
    for seqlen in (int(n) for n in args.seqlens.split(",")):
        tokens = torch.randint(0, config["vocab"], (args.batch, seqlen), device=args.device)
        timers = {(a, w): _timer(a, w, tokens, config, args.device) for a in ("sdpa", "flashtriton") for w in ways}
        times = {key: [timer(*((2, 1) if args.tiny else ())) for _ in range(ROUNDS)] for key, timer in timers.items()}
        for (attention, way), ms in times.items():
            rows.append(dict(seqlen=seqlen, attention=attention, way=way, ms=statistics.median(ms),
                             ran_flashtriton_kernels=timers[attention, way].routed))
        print(seqlen, {f"{a}/{w}": round(statistics.median(ms), 3) for (a, w), ms in times.items()}, flush=True)
        torch._dynamo.reset()
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "compiled_model.json").write_text(json.dumps(dict(config=config, batch=args.batch, rows=rows),
                                                                 indent=1))


if __name__ == "__main__":
    main()
