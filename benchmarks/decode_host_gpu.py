"""The host time of a decoding step's attention on a GPU, two ways (the CPU-only counterpart:
decode_host_cpu.py):

- bare: flash_attention_with_kvcache in a tight loop, q (1, 8, 1, 32) against a new 129-192-key cache
  each call (as a growing cache passes), with an int length and with a lengths tensor;
- in situ: inside one greedy generate() of a random tiny Llama (benchmarks/generate.py's), B1, 64 new
  tokens, the host time spent in each backend's attention function (no synchronisation: what the host
  spends there), ours against transformers' SDPA function, median and total over the 256 calls.

    PYTHONPATH=src python benchmarks/decode_host_gpu.py
"""

from __future__ import annotations

import statistics
import time

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from flashtriton import flash_attention_with_kvcache
from flashtriton.integrations.transformers import NAME, attention_forward
from flashtriton.validation import mark_kvcache_checked
from generate import _generate, _model

CALLS = 2000


def bare() -> None:
    q = torch.randn(1, 8, 1, 32, device="cuda", dtype=torch.bfloat16)
    caches = [tuple(torch.randn(1, 2, n, 32, device="cuda", dtype=torch.bfloat16) for _ in range(2))
              for n in range(129, 193)]
    lengths = [torch.full((1,), n, dtype=torch.int32, device="cuda") for n in range(129, 193)]
    for (k, _), n in zip(caches, lengths, strict=True):
        mark_kvcache_checked(n, k)  # as the transformers backend's lengths: no read back
    calls = {"int": lambda i: flash_attention_with_kvcache(q, *caches[i % 64], caches[i % 64][0].shape[2],
                                                           is_causal=True),
             "tensor": lambda i: flash_attention_with_kvcache(q, *caches[i % 64], lengths[i % 64], is_causal=True)}
    with torch.no_grad():
        for name, call in calls.items():
            for i in range(128):
                call(i)
            torch.cuda.synchronize()
            start = time.perf_counter()
            for i in range(CALLS):
                call(i)
            print(f"decode call, {name} lengths: host {(time.perf_counter() - start) / CALLS * 1e6:.1f} us", flush=True)
            torch.cuda.synchronize()


def in_situ() -> None:
    torch.manual_seed(0)
    models = {impl: _model("tiny", impl) for impl in (NAME, "sdpa")}
    models[NAME].load_state_dict(models["sdpa"].state_dict())
    ids = torch.randint(0, 32000, (1, 128), device="cuda")
    spent: dict[str, list[float]] = {}

    def timed(name, fn):
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            out = fn(*args, **kwargs)
            spent[name].append(time.perf_counter() - start)
            return out
        return wrapper
    for impl, fn in ((NAME, attention_forward), ("sdpa", sdpa_attention_forward)):
        spent[impl] = []
        AttentionInterface.register(impl, timed(impl, fn))
    with torch.no_grad():
        for impl, model in models.items():
            _generate(model, ids, None)  # warm-up: compiles, records launches
            torch.cuda.synchronize()
            spent[impl].clear()
            start = time.perf_counter()
            _generate(model, ids, None)
            torch.cuda.synchronize()
            total, times = time.perf_counter() - start, spent[impl]
            print(f"{impl}: generate {total * 1e3:.1f} ms, {len(times)} attention calls, host in attention "
                  f"{sum(times) * 1e3:.2f} ms, median {statistics.median(times) * 1e6:.1f} us, p90 "
                  f"{sorted(times)[int(0.9 * len(times))] * 1e6:.1f} us", flush=True)


if __name__ == "__main__":
    bare()
    in_situ()
