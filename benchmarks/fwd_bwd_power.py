"""Three probes of why cs336's forward + backward in one call (bench.py's fwd_bwd) took longer than its
forward and backward timed apart, on a GPU (docs/performance.md, entry 112), at cs336's shape and at
B4 H16 N4096 D128 causal:

- `host`: host milliseconds per call against the GPU's, over 20 calls without synchronising, of the
  forward + backward through autograd and of the launchers alone (with the garbage collector off too),
  then cProfile's top functions over ten autograd calls, and what torch.cuda.set_sync_debug_mode reports
  in one: whether the host falls behind the GPU;
- `ahead`: 30 calls of each form as do_bench times them (L2 flushed by zeroing 256 MB, grads to None,
  events around the call, one more between forward and backward; medians in ms of the forward part, the
  backward part and the whole), and again with a ~1 ms GPU spin (torch.cuda._sleep) queued before each
  call, so that the host has issued the call before the GPU reaches it and the GPU has idled a millisecond;
- `power`: two seconds of back-to-back calls of each provider named (bench.py's; by default ours, cuDNN's,
  ours again), forward, backward and both in one call, while nvidia-smi samples the SM clock, the power
  draw and the clock-event reasons every 20 ms (0x4: the software power cap); joules per call from the
  samples' mean power.

- `rounds`: the cs336 suite's timers, step by step in one process, beside an nvidia-smi trace: whether a
  mode timed before the one call slows it (docs/performance.md, entry 138).

    PYTHONPATH=src python benchmarks/fwd_bwd_power.py host|ahead|power [providers...]
    PYTHONPATH=src python benchmarks/fwd_bwd_power.py rounds fwd_bwd,bwd,fwd_bwd,sleep,fwd_bwd [trace.csv]
"""

import cProfile
import gc
import io
import pstats
import statistics
import subprocess
import sys
import time
import warnings

import torch

from flashtriton import flash_attention
from flashtriton.launch.backward import attention_backward
from flashtriton.launch.forward import attention_forward

SHAPES = [(1, 16, 16384, 64), (4, 16, 4096, 128)]  # causal


def inputs(batch: int, heads: int, n: int, head_dim: int):
    torch.manual_seed(0)
    q, k, v = (torch.randn(batch, heads, n, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    o = flash_attention(q, k, v, is_causal=True)
    return q, k, v, o, torch.randn_like(o)


def clear_grads(*tensors: torch.Tensor) -> None:
    """What do_bench's grad_to_none does before each call: the gradients dropped, not accumulated."""
    for x in tensors:
        x.grad = None


def host(batch: int, heads: int, n: int, head_dim: int) -> None:
    q, k, v, o, do = inputs(batch, heads, n, head_dim)
    scale = head_dim ** -0.5

    def launchers():
        with torch.no_grad():
            out, lse = attention_forward(q, k, v, True, scale)
            return attention_backward(do, q, k, v, out, lse, True, scale)

    def autograd():
        clear_grads(q, k, v)
        flash_attention(q, k, v, is_causal=True).backward(do)

    def per_call(name, fn, calls=20):
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        print(f"{name:18s} host/call {1e3 * (t1 - t0) / calls:7.3f} ms total/call {1e3 * (t2 - t0) / calls:7.3f} ms",
              flush=True)
    per_call("fwd_bwd", autograd)
    per_call("launchers", launchers)
    gc.disable()
    per_call("fwd_bwd_nogc", autograd)
    gc.enable()
    prof = cProfile.Profile()
    torch.cuda.synchronize()
    prof.enable()
    for _ in range(10):
        autograd()
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(22)
    print(text.getvalue()[:6000])
    with warnings.catch_warnings(record=True) as caught:  # what PyTorch's own check calls synchronising
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode(1)
        autograd()
        torch.cuda.set_sync_debug_mode(0)
    print("synchronising ops seen by torch.cuda.set_sync_debug_mode:",
          [str(w.message)[:100] for w in caught if "prototype" not in str(w.message)])


def ahead(batch: int, heads: int, n: int, head_dim: int) -> None:
    q, k, v, o, do = inputs(batch, heads, n, head_dim)
    scale = head_dim ** -0.5
    cache = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda")

    def launchers(mid):
        with torch.no_grad():
            out, lse = attention_forward(q, k, v, True, scale)
            mid.record()
            attention_backward(do, q, k, v, out, lse, True, scale)

    def autograd(mid):
        out = flash_attention(q, k, v, is_causal=True)
        mid.record()
        out.backward(do)

    def fwd(mid):
        with torch.no_grad():
            flash_attention(q, k, v, is_causal=True)
        mid.record()

    def bwd(mid):
        mid.record()
        o.backward(do, retain_graph=True)
    results = {}
    for name, fn in (("fwd", fwd), ("bwd", bwd), ("launchers", launchers), ("autograd", autograd)):
        for spin in (False, True):
            for _ in range(5):
                clear_grads(q, k, v)
                fn(torch.cuda.Event())
            torch.cuda.synchronize()
            events = [[torch.cuda.Event(enable_timing=True) for _ in range(3)] for _ in range(30)]
            for start, mid, end in events:
                clear_grads(q, k, v)
                cache.zero_()
                if spin:
                    torch.cuda._sleep(2_000_000)  # ~1 ms: the host issues the call while the GPU spins
                start.record()
                fn(mid)
                end.record()
            torch.cuda.synchronize()
            parts = [statistics.median(a.elapsed_time(b) for a, b in pairs)
                     for pairs in ([(s, m) for s, m, _ in events], [(m, e) for _, m, e in events],
                                   [(s, e) for s, _, e in events])]
            results[name + ("_ahead" if spin else "")] = tuple(round(p, 4) for p in parts)
    print(f"B{batch} H{heads} N{n} D{head_dim}", results, flush=True)


def _calls(provider, q, k, v, do, shape):
    """The three calls `power` loops over, for one provider: forward, backward (of one kept forward) and
    both in one call."""
    kept = provider.run(q, k, v, shape)

    def fwd():
        with torch.no_grad():
            provider.run(q, k, v, shape)

    def bwd():
        clear_grads(q, k, v, *provider.leaves())
        kept.backward(do, retain_graph=True)

    def fwd_bwd():
        clear_grads(q, k, v)
        provider.run(q, k, v, shape).backward(do)
    return {"fwd": fwd, "bwd": bwd, "fwd_bwd": fwd_bwd}


def _sampled(label: str, call) -> None:
    """Two seconds of back-to-back calls while nvidia-smi samples; one line of what it saw."""
    for _ in range(5):
        call()
    torch.cuda.synchronize()
    time.sleep(1.0)
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw,clocks_event_reasons.active",
                            "--format=csv,noheader,nounits", "-lms", "20"], stdout=subprocess.PIPE, text=True)
    time.sleep(0.3)
    t0, calls = time.perf_counter(), 0
    while time.perf_counter() - t0 < 2.0:
        call()
        calls += 1
        if calls % 8 == 0:  # (the host stays at most eight calls ahead)
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    ms = 1e3 * (time.perf_counter() - t0) / calls
    smi.terminate()
    rows = [line.split(", ") for line in smi.communicate()[0].strip().splitlines() if line.count(",") == 2]
    rows = rows[len(rows) // 8:]  # (the samples before the loop's first calls)
    clocks, watts = [float(r[0]) for r in rows], [float(r[1]) for r in rows]
    print(f"{label:22s} {ms:7.3f} ms/call  sm clock median {statistics.median(clocks):.0f} "
          f"min {min(clocks):.0f} MHz  power mean {statistics.mean(watts):.0f} max {max(watts):.0f} W  "
          f"{statistics.mean(watts) * ms / 1e3:.3f} J/call  reasons {sorted({r[2] for r in rows})}  "
          f"samples {len(rows)}", flush=True)


def power(batch: int, heads: int, n: int, head_dim: int, providers: tuple[str, ...]) -> None:
    """Each provider of bench.py (flashtriton, sdpa_cudnn, fa4 where FLASHTRITON_FA4_SITE makes it
    importable) in turn, for the forward alone, the backward alone and both in one call: two seconds of
    back-to-back calls while nvidia-smi samples the SM clock, the power draw and the clock-event reasons
    every 20 ms (0x4: the software power cap). Joules per call are the samples' mean power times the time
    per call: not every driver has the energy counter (`total_energy_consumption` is not a field of the
    device machine's nvidia-smi)."""
    from flashtriton.tools.bench import PROVIDERS, Shape
    shape = Shape(batch, heads, heads, n, n, head_dim, True)
    q, k, v, _, do = inputs(batch, heads, n, head_dim)
    for name in providers:
        provider = PROVIDERS[name]
        with provider.context():
            for mode, call in _calls(provider, q, k, v, do, shape).items():
                _sampled(f"{name} {mode}", call)


def rounds(steps: str, trace: str | None) -> None:
    """The cs336 suite's timings as run_suite makes them (provider_timer; bench.ROUNDS interleaved rounds of
    ours and cuDNN's per step), for `steps` in order in one process: fwd, bwd or fwd_bwd, or `sleep` (5 s
    idle). Each timing is printed with the seconds since the warm-up ended, so that it can be laid beside
    an nvidia-smi trace of the SM clock, power, temperature and clock-event reasons every 100 ms, written
    to `trace` where given (docs/performance.md, entry 138: how long the load has run sets the clock)."""
    from flashtriton.tools import bench
    shape = bench.cs336_suite()[0]
    q, k, v = bench.make_qkv(shape.batch, shape.heads_q, shape.heads_kv, shape.seqlen_q, shape.seqlen_k,
                             shape.head_dim, torch.bfloat16, "cuda")
    trace_file = open(trace, "w") if trace else None  # (nvidia-smi writes it until the steps are done)
    smi = None if trace_file is None else subprocess.Popen(
        ["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active",
         "--format=csv", "-lms", "100"], stdout=trace_file)
    try:
        bench.warm_up_gpu()
        t0 = time.time()
        for step in steps.split(","):
            if step == "sleep":
                time.sleep(5)
                print(f"{time.time() - t0:7.2f} slept", flush=True)
                continue
            timers = {name: bench.provider_timer(name, shape, step, q, k, v) for name in ("flashtriton", "sdpa_cudnn")}
            for r in range(bench.ROUNDS):
                for name, timed in timers.items():
                    ms = timed()
                    print(f"{time.time() - t0:7.2f} {step:8s} {name:12s} round {r} {ms:.3f} ms", flush=True)
            del timers
    finally:  # (no nvidia-smi left sampling behind a failed step)
        if smi is not None:
            smi.terminate()
            smi.wait()
            trace_file.close()


if __name__ == "__main__":
    if sys.argv[1] == "rounds":  # steps, then where to write the nvidia-smi trace (optional)
        rounds(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None)
    elif sys.argv[1] == "power":  # providers: the rest of the command line (default: ours, cuDNN's, ours again)
        power(*SHAPES[0], tuple(sys.argv[2:]) or ("flashtriton", "sdpa_cudnn", "flashtriton"))
    else:
        probe = {"host": host, "ahead": ahead}[sys.argv[1]]
        for shape in SHAPES[:1] if probe is host else SHAPES:
            probe(*shape)
