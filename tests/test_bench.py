"""The benchmark's bookkeeping (suites, FLOP counts, tables, result files); timing itself needs a GPU."""

import importlib.util
import json
import os
from pathlib import Path

import pytest

from flashtriton.tools.bench import (
    SUITES,
    Row,
    Shape,
    article_table,
    environment_variable,
    memory_table,
    provider_table,
    write_results,
)


def test_suites_match_their_definitions():
    article = SUITES["article"]()
    assert {(s.batch, s.heads_q, s.head_dim) for s in article} == {(4, 8, 64)}
    assert sorted({s.seqlen_q for s in article}) == [512, 1024, 2048, 4096]
    paper = SUITES["paper"]()
    assert len(paper) == 2 * 2 * 6
    assert all(s.batch * s.seqlen_q == 16384 and s.heads_q * s.head_dim == 2048 for s in paper)
    assert SUITES["cs336"]() == [Shape(1, 16, 16, 16384, 16384, 64, True)]
    assert [s.seqlen_q for s in SUITES["memory"]()] == [16384, 65536]


def test_flops_follow_the_papers_convention():
    shape = Shape(4, 8, 8, 4096, 4096, 64, False)
    assert shape.flops("fwd") == 4 * 4 * 8 * 4096 * 4096 * 64
    causal = Shape(4, 8, 8, 4096, 4096, 64, True)
    assert causal.flops("fwd") == shape.flops("fwd") / 2
    assert causal.flops("bwd") == 2.5 * causal.flops("fwd")
    assert causal.flops("fwd_bwd") == 3.5 * causal.flops("fwd")


def test_tables_and_result_files(tmp_path):
    rows = [Row("flashtriton", "article", 4, 8, 8, 1024, 1024, 64, "bf16", True, "fwd", 0.05, 100.0, 1e-3),
            Row("sdpa", "article", 4, 8, 8, 1024, 1024, 64, "bf16", True, "fwd", 0.04, 125.0, 1e-3)]
    assert "| 1024 | yes | 0.050 | 0.040 | 100 | 125 | 80% |" in article_table(rows)
    assert "| 4 | 8 | 1024 | 64 | yes | fwd | 100 | 125 | 0.80 |" in provider_table(rows)
    meta = {"gpu": "test", "torch": "x", "triton": "y", "commit": "z", "date": "d"}
    write_results(tmp_path, "article", rows, meta)
    data = json.loads((tmp_path / "article.json").read_text())
    assert data["meta"] == meta
    required = {"provider", "suite", "B", "Hq", "Hkv", "Nq", "Nk", "D", "dtype", "causal", "mode", "ms", "tflops"}
    assert all(required <= set(row) for row in data["rows"])
    assert (tmp_path / "article.md").exists()


def test_results_of_a_suite_timed_in_parts_merge(tmp_path):
    def row(provider, d, ms):
        return Row(provider, "paper", 4, 2048 // d, 2048 // d, 4096, 4096, d, "bf16", False, "fwd", ms, 1.0)
    meta = {"gpu": "test", "torch": "x", "triton": "y", "commit": "first", "date": "d"}
    write_results(tmp_path, "paper", [row("flashtriton", 64, 1.0), row("sdpa", 64, 2.0)], meta)
    later = dict(meta, commit="second")
    rows = write_results(tmp_path, "paper", [row("flashtriton", 64, 0.5), row("flashtriton", 128, 3.0)], later,
                         merge=True)
    data = json.loads((tmp_path / "paper.json").read_text())
    assert sorted((r["provider"], r["D"], r["ms"]) for r in data["rows"]) == [
        ("flashtriton", 64, 0.5), ("flashtriton", 128, 3.0), ("sdpa", 64, 2.0)]
    assert len(rows) == 3
    assert data["meta"]["commit"] == "second" and data["meta"]["merged"] == [dict(meta, rows=1)]
    assert "**Not one run**: beside this run's rows are rows of 1 earlier runs (commits first" in (
        tmp_path / "paper.md").read_text()
    write_results(tmp_path, "paper", [row("flashtriton", 64, 0.7)], dict(meta, commit="third"))  # no merge
    assert len(json.loads((tmp_path / "paper.json").read_text())["rows"]) == 1


def test_peak_memory_is_tabled_and_out_of_memory_is_said(tmp_path):
    def row(provider, n, peak):
        return Row(provider, "memory", 1, 16, 16, n, n, 64, "bf16", True, "fwd_bwd", 1.0, 1.0, peak_mem_mb=peak)
    rows = [row("flashtriton", 16384, 100.4), row("sdpa_math", 16384, 40960.0), row("flashtriton", 65536, 400.0)]
    unavailable = [{"provider": "sdpa_math", "mode": "check", "batch": 1, "heads_q": 16, "heads_kv": 16,
                    "seqlen_q": 65536, "seqlen_k": 65536, "head_dim": 64, "causal": True,
                    "reason": "CUDA out of memory. Tried to allocate 128.00 GiB"}]
    table = memory_table(rows, unavailable)
    assert "| 1 | 16 | 16384 | 64 | yes | 100 | 40960 |" in table
    assert "| 1 | 16 | 65536 | 64 | yes | 400 | OOM |" in table
    meta = {"gpu": "test", "torch": "x", "triton": "y", "commit": "z", "date": "d", "unavailable": unavailable}
    write_results(tmp_path, "memory", rows, meta)
    assert "| 400 | OOM |" in (tmp_path / "memory.md").read_text()
    data = json.loads((tmp_path / "memory.json").read_text())
    assert data["rows"][0]["peak_mem_mb"] == 100.4 and data["meta"]["unavailable"] == unavailable


def test_roofline_bookkeeping(tmp_path):
    from flashtriton.tools.roofline import Ceilings, Point, minimal_bytes, write_report

    shape = Shape(4, 32, 32, 4096, 4096, 64, False)
    tensor = 4 * 32 * 4096 * 64 * 2
    assert minimal_bytes(shape, "fwd") == 4 * tensor + 4 * 32 * 4096 * 4
    assert minimal_bytes(shape, "bwd") == 8 * tensor + 2 * 4 * 32 * 4096 * 4
    meta = {"gpu": "test", "torch": "x", "triton": "y", "commit": "z", "date": "d"}
    points = [Point("flashtriton", "D64-N4096-full", "fwd", 400.0, shape.flops("fwd") / minimal_bytes(shape, "fwd"))]
    write_report(tmp_path, Ceilings(700.0, 4.2), points, {"D64": "ncu is not on the PATH"}, meta)
    text = (tmp_path / "roofline.md").read_text()
    assert "| flashtriton | D64-N4096-full | fwd | 400 | 57% |" in text and "ncu is not on the PATH" in text
    # the plot is drawn exactly when the optional matplotlib is installed
    assert (tmp_path / "roofline.png").exists() == (importlib.util.find_spec("matplotlib") is not None)


def test_ncu_profiles_the_kernel_it_is_asked_for(tmp_path, monkeypatch):
    """The ncu command line (no ncu here: the subprocess is faked): the backward's kernels are profiled
    from a target that runs the backward inside the NVTX range."""
    import subprocess

    import pytest

    from flashtriton.tools import roofline

    seen = []
    monkeypatch.setattr(roofline.shutil, "which", lambda name: "/usr/bin/ncu")
    monkeypatch.setattr(roofline.subprocess, "run", lambda cmd, **kw: seen.append(cmd) or subprocess.CompletedProcess(
        cmd, 0, stdout='"Section Name","Metric Name","Metric Unit","Metric Value"\n"SOL","Duration","us","12"\n',
        stderr=""))
    for kernel in roofline.PROFILED_KERNELS:
        rows = roofline.ncu_summary(128, False, tmp_path / f"{kernel}.csv", kernel)
        assert rows == [{"section": "SOL", "metric": "Duration", "unit": "us", "value": "12"}]
        cmd = seen[-1]
        assert cmd[cmd.index("--kernel-name") + 1] == kernel
        assert ("--backward" in cmd) == (kernel != "attn_fwd_kernel")
    with pytest.raises(ValueError, match="kernel must be one of"):
        roofline.ncu_summary(64, False, tmp_path / "x.csv", "attn_bwd_kernel")


def test_peak_memory_measures_one_forward_and_backward(monkeypatch):
    """The GPU-only measurement's flow, with torch.cuda's counters faked on CPU."""
    import torch

    from flashtriton.tools import bench

    calls = []
    counters = iter([1000, 1000 + 5 * 2**20])  # memory_allocated before, then the peak
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda: calls.append("reset"))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda: next(counters))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda: next(counters))

    def run(q, k, v, shape):
        calls.append("run")
        return torch.softmax(q @ k.transpose(-1, -2), -1) @ v
    monkeypatch.setitem(bench.PROVIDERS, "fake", bench.Provider(run))
    q, k, v = (torch.randn(1, 1, 8, 4, requires_grad=True) for _ in range(3))
    q.grad = torch.ones_like(q)
    assert bench.peak_memory_mb("fake", Shape(1, 1, 1, 8, 8, 4, False), q, k, v) == 5.0
    assert calls == ["reset", "run"] and q.grad is None and k.grad is None  # gradients left cleared


def test_merge_results_script_keeps_every_runs_meta(tmp_path):
    """benchmarks/merge_results.py: later files replace earlier rows, and the meta lists every run whose
    rows remain, in order."""
    import subprocess
    import sys

    def row(provider, d, ms):
        return Row(provider, "paper", 4, 2048 // d, 2048 // d, 4096, 4096, d, "bf16", False, "fwd", ms, 1.0)
    files = []
    for name, rows in (("a", [row("flashtriton", 64, 1.0), row("sdpa", 64, 2.0)]),
                       ("b", [row("flashtriton", 128, 3.0)]), ("c", [row("flashtriton", 64, 0.5)])):
        meta = {"gpu": "test", "torch": "x", "triton": "y", "commit": name, "date": "d"}
        write_results(tmp_path / name, "paper", rows, meta)
        files.append(str(tmp_path / name / "paper.json"))
    script = Path(__file__).parent.parent / "benchmarks" / "merge_results.py"
    subprocess.run([sys.executable, str(script), "--out", str(tmp_path / "out"), *files], check=True,
                   capture_output=True)
    data = json.loads((tmp_path / "out" / "paper.json").read_text())
    assert sorted((r["provider"], r["D"], r["ms"]) for r in data["rows"]) == [
        ("flashtriton", 64, 0.5), ("flashtriton", 128, 3.0), ("sdpa", 64, 2.0)]
    assert data["meta"]["commit"] == "c"
    assert [(m["commit"], m["rows"]) for m in data["meta"]["merged"]] == [("b", 1), ("a", 1)]


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_variants_suite_shapes_flops_and_peers_semantics():
    """The variants suite: every option once, FLOPs that count a window's visible pairs, flex's mask and
    score_mod with our semantics (checked on CPU against the reference through torch's own flex_attention
    in eager mode), and SDPA declining what it cannot run."""
    import torch

    from flashtriton import attention_ref
    from flashtriton.tools import bench

    shapes = bench.variants_suite()
    variants = {s.variant for s in shapes}
    assert {"gqa4", "window4096,0", "softcap50", "alibi", ""} <= variants
    assert bench.visible_pairs(5, 5, False, (2, 0)) == 1 + 2 + 3 + 3 + 3
    assert bench.visible_pairs(4, 6, True, (-1, -1)) == sum(min(6, i + 3) for i in range(4))
    window = Shape(1, 16, 16, 16384, 16384, 128, True, window=(4096, 0))
    assert window.flops("fwd") == 4.0 * 16 * 128 * bench.visible_pairs(16384, 16384, True, (4096, 0))
    assert Shape(1, 2, 2, 8, 8, 4, True).flops("fwd") == 4.0 * 2 * 8 * 8 * 4 / 2  # ANCHORS.md's convention
    shape = Shape(1, 4, 2, 37, 53, 16, True, window=(9, -1), softcap=3.0, alibi=True)
    q, k, v = (torch.randn(1, h, n, 16) for h, n in ((4, 37), (2, 53), (2, 53)))
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    block_mask, score_mod = bench._flex_mods(shape, q, create_block_mask)
    out = flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, enable_gqa=True)
    ref, _ = attention_ref(q.double(), k.double(), v.double(), is_causal=True, window_size=(9, -1), softcap=3.0,
                           alibi_slopes=bench.alibi_slopes(4, "cpu"))
    assert (out.double() - ref).abs().max() < 1e-4
    with pytest.raises(NotImplementedError):
        bench.PROVIDERS["sdpa"].run(q, k, v, shape)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_varlen_shape_runs_the_same_attention_for_every_provider():
    """A packed batch in the variants suite: ours (flash_attention_varlen through the interpreter), flex
    with a document mask (eager, on CPU) and the per-sequence reference agree; FLOPs count each sequence."""
    import torch
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    from conftest import DEVICE
    from flashtriton.tools import bench

    shape = Shape(1, 2, 2, 22, 22, 16, True, varlen=(5, 0, 17))
    assert shape.variant == "varlen3" and shape.flops("fwd") == 4.0 * 2 * 16 * (25 + 289) / 2
    q, k, v = (torch.randn(1, 2, 22, 16, device=DEVICE) for _ in range(3))
    ref, part = bench._reference(q, k, v, shape)
    ours = bench.PROVIDERS["flashtriton"].run(q, k, v, shape)
    block_mask, score_mod = bench._flex_mods(shape, q, create_block_mask)
    flex = flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask)
    assert ours.shape == q.shape
    assert (ours[part] - ref).abs().max() < 1e-4 and (flex[part] - ref).abs().max() < 1e-4


def test_suite_times_the_providers_in_interleaved_rounds(monkeypatch):
    """Every (shape, mode) times each provider once per round, in turn, and keeps the median: a drift of
    the clocks during a suite then hits every provider alike. CPU fakes stand in for the GPU parts."""
    import contextlib

    import torch

    from flashtriton import testing
    from flashtriton.tools import bench

    current, timed = [None], []
    fake_ms = {("a", "fwd"): iter([3.0, 1.0, 2.0]), ("b", "fwd"): iter([2.0, 2.0, 2.0]),
               ("a", "bwd"): iter([5.0, 4.0, 6.0]), ("b", "bwd"): iter([9.0, 7.0, 8.0])}

    def provider(name):
        @contextlib.contextmanager
        def context():  # the timer enters the provider's context around each timing
            current[0] = name
            yield
            current[0] = None

        def run(q, k, v, shape):
            return torch.softmax(q @ k.transpose(-1, -2) * shape.head_dim ** -0.5, -1) @ v
        return bench.Provider(run, context)

    def fake_time(fn, grad_to_none=None):
        fn()  # the forward, or the backward through the graph the timer kept
        mode = "fwd" if grad_to_none is None else "bwd"
        timed.append((current[0], mode))
        return next(fake_ms[current[0], mode])

    monkeypatch.setattr(bench, "warm_up_gpu", lambda: None)
    monkeypatch.setattr(bench, "make_qkv", lambda *args: testing.make_qkv(*args[:-1], "cpu"))
    monkeypatch.setattr(bench, "_time", fake_time)
    monkeypatch.setattr(bench, "_time_graph", lambda fn: 1.0)
    monkeypatch.setitem(bench.SUITES, "tiny", lambda: [Shape(1, 2, 2, 17, 17, 8, False)])
    monkeypatch.setitem(bench.PROVIDERS, "a", provider("a"))
    monkeypatch.setitem(bench.PROVIDERS, "b", provider("b"))
    rows = bench.run_suite("tiny", ["a", "b"], ["fwd", "bwd"], dtype=torch.float32, log=lambda line: None)
    assert timed == [("a", "fwd"), ("b", "fwd")] * bench.ROUNDS + [("a", "bwd"), ("b", "bwd")] * bench.ROUNDS
    by_key = {(row.provider, row.mode): row for row in rows}
    assert (by_key["a", "fwd"].ms, by_key["a", "fwd"].spread) == (2.0, 1.0)  # median of 3, 1, 2; (3 - 1) / 2
    assert (by_key["b", "fwd"].ms, by_key["b", "fwd"].spread) == (2.0, 0.0)
    assert (by_key["b", "bwd"].ms, by_key["b", "bwd"].spread) == (8.0, 0.25)
    assert by_key["a", "fwd"].ms_graph == 1.0 and by_key["a", "bwd"].ms_graph is None


def test_fa4_provider_is_unavailable_without_its_wheels(monkeypatch):
    """Where flash-attn-4 does not import (this machine), the fa4 provider says so, and the bench records
    it as unavailable (NotImplementedError) instead of failing the suite."""
    import sys

    import torch

    from flashtriton.testing import make_qkv
    from flashtriton.tools import bench
    monkeypatch.setitem(sys.modules, "flash_attn.cute", None)  # an import of it raises ImportError
    monkeypatch.delenv("FLASHTRITON_FA4_SITE", raising=False)
    run = bench._fa4().run
    q, k, v = make_qkv(1, 2, 2, 16, 16, 64, torch.bfloat16, "cpu")
    with pytest.raises(NotImplementedError, match="flash-attn-4 is not importable"):
        run(q, k, v, bench.Shape(1, 2, 2, 16, 16, 64, True))


@pytest.mark.parametrize("mode", ["bwd", "fwd_bwd"])
def test_fa4_backward_timings_drop_the_copies_gradients(monkeypatch, mode):
    """The fa4 provider's gradients land on its (B, N, H, D) copies of q, k and v, not on them: the timer
    drops those before each call too (Provider.leaves), so that a timed backward is one backward, not one
    plus the adds of its gradients into the last call's (until 2026-12-07 the bwd mode timed FA4 with those
    adds: three read-add-writes of the gradients per call). flash_attn_func stands in as plain attention
    over (B, N, H, D); the timer as do_bench runs it, gradients to None before each of three calls."""
    import sys
    import types

    import torch

    from flashtriton.reference import attention_ref
    from flashtriton.testing import make_qkv
    from flashtriton.tools import bench

    def attention(q, k, v, causal):  # (B, N, H, D), as FA4 takes them
        o, _ = attention_ref(*(x.transpose(1, 2) for x in (q, k, v)), is_causal=causal)
        return o.transpose(1, 2)
    monkeypatch.setitem(sys.modules, "flash_attn.cute", types.SimpleNamespace(flash_attn_func=attention))
    monkeypatch.delenv("FLASHTRITON_FA4_SITE", raising=False)
    provider = bench._fa4()
    monkeypatch.setitem(bench.PROVIDERS, "fa4_stand_in", provider)

    def do_bench_like(fn, grad_to_none=None):
        for _ in range(3):
            for x in grad_to_none:
                x.grad = None
            fn()
        return 1.0
    monkeypatch.setattr(bench, "_time", do_bench_like)
    shape = bench.Shape(1, 2, 2, 17, 17, 8, True)
    q, k, v = make_qkv(1, 2, 2, 17, 17, 8, torch.float64, "cpu")
    for x in (q, k, v):
        x.requires_grad_(True)
    torch.manual_seed(1)  # dO, as the timer draws it
    bench.provider_timer("fa4_stand_in", shape, mode, q, k, v)()
    copies = provider.leaves()
    assert len(copies) == 3 and all(c.grad is not None for c in copies)
    torch.manual_seed(1)
    leaves = [x.detach().transpose(1, 2).contiguous().requires_grad_() for x in (q, k, v)]
    out = attention(*leaves, causal=True).transpose(1, 2)
    out.backward(torch.randn_like(out))
    for copy, leaf in zip(copies, leaves, strict=True):
        torch.testing.assert_close(copy.grad, leaf.grad)  # one call's gradients (three calls' would be 3x)


@pytest.mark.parametrize("before", [None, "triton"])
def test_environment_variable_sets_one_variable_and_restores_it(monkeypatch, before):
    """The forced-path providers' context: the variable holds the value inside, and afterwards what it held
    before (absent stays absent), also when the block raises; the rest of the environment is untouched."""
    name = "FLASHTRITON_TEST_PATH"
    if before is None:
        monkeypatch.delenv(name, raising=False)
    else:
        monkeypatch.setenv(name, before)
    others = {key: value for key, value in os.environ.items() if key != name}
    with pytest.raises(RuntimeError):
        with environment_variable(name, "gluon"):
            assert os.environ[name] == "gluon"
            raise RuntimeError
    assert os.environ.get(name) == before
    assert {key: value for key, value in os.environ.items() if key != name} == others
