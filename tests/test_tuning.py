"""Tile selection: the resource model's pruning, the autotuner's key and candidates, the TMA eligibility."""

import pytest
import torch

from conftest import DEVICE
from flashtriton import attention_ref, launch
from flashtriton.cache import reset
from flashtriton.launch import autotune, descriptors, tiles
from flashtriton.launch.tiles import HOPPER_SHARED_MEMORY, TileConfig, backward_configs, why_pruned, why_pruned_backward
from flashtriton.testing import bounded
from helpers import check_against_reference, make_qkv, with_backward_tiles

SMEM = HOPPER_SHARED_MEMORY


def test_seqlen_bucket_rounds_the_longer_length_up_to_a_power_of_two():
    assert autotune.seqlen_bucket(1, 1) == 1
    assert autotune.seqlen_bucket(17, 23) == 32
    assert autotune.seqlen_bucket(4096, 4096) == 4096
    assert autotune.seqlen_bucket(4097, 10) == 8192


def test_resource_model_prunes_what_cannot_run_well():
    bf16 = torch.bfloat16
    assert why_pruned(TileConfig(128, 64, 4, 3, use_tma=True), 64, bf16, SMEM) is None
    assert "shared memory" in why_pruned(TileConfig(128, 128, 8, 4), 256, bf16, SMEM)
    assert "would spill" in why_pruned(TileConfig(128, 128, 4, 2), 64, bf16, SMEM)
    assert "needs the TMA loads" in why_pruned(TileConfig(128, 64, 8, 3, warp_specialize=True), 128, bf16, SMEM)
    assert "8 warps" in why_pruned(TileConfig(128, 64, 4, 3, use_tma=True, warp_specialize=True), 64, bf16, SMEM)
    assert "16-bit" in why_pruned(TileConfig(128, 64, 8, 3, True, True), 64, torch.float32, SMEM)
    assert "64 query rows" in why_pruned(TileConfig(64, 64, 8, 3), 64, bf16, SMEM)


@pytest.mark.parametrize("head_dim,dtype,with_tma", [(64, torch.bfloat16, True), (128, torch.bfloat16, False),
                                                     (128, torch.bfloat16, True), (64, torch.float32, True),
                                                     (256, torch.float16, True), (40, torch.bfloat16, True)])
def test_autotuner_candidates_follow_the_head_dim(head_dim, dtype, with_tma):
    q = torch.empty(1, 1, 8, head_dim, dtype=dtype)
    configs = autotune.autotuner("fwd", launch.DEFAULT_KERNELS.forward, with_tma).configs
    cfgs = [autotune.tile_config_of(c) for c in autotune.prune_forward(configs, {"Q": q}, HEAD_DIM=head_dim)]
    wanted = autotune.FORWARD_CANDIDATES[autotune.width_class(head_dim, dtype)]
    assert cfgs and all(c in wanted for c in cfgs)  # the candidates are TileConfigs
    assert all(why_pruned(c, head_dim, dtype, SMEM) is None for c in cfgs)
    assert any(c.use_tma for c in cfgs) == with_tma
    assert not any(c.warp_specialize for c in cfgs)  # a no-op on sm_90 with Triton 3.6 (NOTES entry 25)


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_autotuned_forward_matches_reference_and_keys_by_bucket(is_causal):
    tuner = autotune.autotuner("fwd", launch.DEFAULT_KERNELS.forward, True)  # contiguous inputs: descriptors at hand
    tuner.cache.clear()
    reset()
    for seqlen_q, seqlen_k in [(17, 29), (3, 31), (63, 97)]:  # buckets 32, 32, 128
        q, k, v = make_qkv(2, 2, 1, seqlen_q, seqlen_k, 64, torch.float16, DEVICE, requires_grad=False)
        o, lse = launch.attention_forward(q, k, v, is_causal, 0.125, autotune=True)
        o64, lse64 = attention_ref(*(x.double() for x in (q, k, v)), is_causal=is_causal, scale=0.125)
        low_o, low_lse = attention_ref(q, k, v, is_causal=is_causal, scale=0.125, upcast=False)
        for check in (bounded("O", o, o64, low_o, q.dtype), bounded("L", lse, lse64, low_lse, q.dtype)):
            assert check.ok, str(check)
    assert len(tuner.cache) == 2  # (17, 29) and (3, 31) share a bucket: tuned once


@pytest.mark.parametrize("kernel", ["dkdv", "dq"])
@pytest.mark.parametrize("head_dim,dtype,with_tma", [(64, torch.bfloat16, True), (64, torch.bfloat16, False),
                                                     (128, torch.bfloat16, True), (96, torch.float32, True),
                                                     (256, torch.float16, True)])
def test_backward_autotuner_candidates_follow_the_head_dim(kernel, head_dim, dtype, with_tma):
    q = torch.empty(1, 1, 8, head_dim, dtype=dtype)
    tile = autotune.tma_candidate_tile(kernel, head_dim, dtype)
    args = {"Q": q}
    if with_tma and tile is not None:  # the launcher builds the descriptors at the first TMA candidate's tile
        bm, bn = tile
        strides = [list(q.stride())] * 4
        args.update(zip(("desc_q", "desc_k", "desc_v", "desc_do"),
                        descriptors.attention_descriptors((q,) * 4, strides, (bm, bn), tiles.block_d(head_dim)),
                        strict=True))
    autotuned = autotune.autotuner(kernel, getattr(launch.DEFAULT_KERNELS, kernel), with_tma)
    cfgs = [autotune.tile_config_of(c) for c in autotuned.early_config_prune(autotuned.configs, args,
                                                                            HEAD_DIM=head_dim)]
    wanted = autotune.BACKWARD_CANDIDATES[kernel][autotune.width_class(head_dim, dtype)]
    assert cfgs and all(c in wanted for c in cfgs)
    static = backward_configs(head_dim, dtype, torch.device("cuda"))[0 if kernel == "dkdv" else 1]
    assert all(c == static or why_pruned_backward(kernel, c, head_dim, dtype, SMEM) is None for c in cfgs)
    assert any(c.use_tma for c in cfgs) == (with_tma and tile is not None)
    if kernel == "dkdv" and head_dim == 128 and with_tma:  # the causal winner since it runs one loop (NOTES 33)
        assert TileConfig(64, 64, 4, 2, True) in cfgs
    if kernel == "dkdv" and head_dim == 64 and with_tma:  # three blocks per SM, and uncapped for the variants
        assert {TileConfig(64, 64, 4, 3, True, max_registers=168), TileConfig(64, 64, 4, 3, True)} <= set(cfgs)


def test_a_register_cap_reaches_the_compiler_and_comes_back():
    """TileConfig.max_registers is the autotuner config's maxnreg (ptxas .maxnreg) and part of its name."""
    capped = TileConfig(64, 64, 4, 3, True, max_registers=168)
    config, plain = autotune.triton_configs([capped, TileConfig(64, 64, 4, 3, True)], True, forward=False)
    assert config.maxnreg == 168 and plain.maxnreg is None and config.all_kwargs()["maxnreg"] == 168
    assert autotune.tile_config_of(config) == capped and autotune.tile_config_of(plain).max_registers is None
    assert capped.name == "M64-N64-w4-s3-tma-r168"


def test_descriptor_boxes_follow_the_launched_tiles_for_the_statistics_too():
    """The dK/dV kernel's (B, H, N) descriptors of L * log2 e and D take BLOCK_M rows like Q and dO."""
    q = torch.randn(1, 2, 70, 64, dtype=torch.bfloat16, device=DEVICE)
    lse2, delta = launch.backward_stats(q, q, torch.randn(1, 2, 70, device=DEVICE))
    descs = launch.backward._descriptors("dkdv", q, q, q, q, lse2, delta, descriptors.tma_strides(q, q, q, q),
                                         (64, 64), 64)
    assert [d.block_shape for d in descs[4:]] == [[1, 1, 64]] * 2
    launched = {}

    class Recorder:  # stands in for the kernel: records what the wrapper launches
        def run(self, *args, **kwargs):
            launched["args"] = args
    wrapped = autotune.WithDescriptorBoxes(launch.DEFAULT_KERNELS.dkdv)
    wrapped.fn = Recorder()
    names = launch.DEFAULT_KERNELS.dkdv.arg_names
    args = [None] * len(names)
    for name, desc in zip(("desc_q", "desc_k", "desc_v", "desc_do", "desc_lse2", "desc_delta"), descs, strict=True):
        args[names.index(name)] = desc
    wrapped.run(*args, BLOCK_M=32, BLOCK_N=128)
    boxes = {name: launched["args"][names.index(name)].block_shape for name in ("desc_q", "desc_k", "desc_do",
                                                                               "desc_lse2", "desc_delta")}
    assert boxes == {"desc_q": [1, 1, 32, 64], "desc_k": [1, 1, 128, 64], "desc_do": [1, 1, 32, 64],
                     "desc_lse2": [1, 1, 32], "desc_delta": [1, 1, 32]}


@pytest.mark.parametrize("head_dim", [64, 128])
def test_autotuned_tma_candidates_of_different_tiles_each_get_their_boxes(monkeypatch, head_dim):
    """The TMA candidates of one width have different tiles (64 x 128 and 128 x 64 at D=64), and the
    launcher builds one set of descriptors: every launch the autotuner times must reset their boxes to its
    own tiles, and compute the right O with them."""
    tuner = autotune.autotuner("fwd", launch.DEFAULT_KERNELS.forward, True)
    tuner.cache.clear()
    reset()
    launches = []

    def timed(kernel_call, quantiles):  # what _time_config does in the interpreter, and a record
        kernel_call()
        args = tuner.nargs
        launches.append((args["desc_q"].block_shape[2], args["desc_k"].block_shape[2], args["O"].clone()))
        return [1.0] * len(quantiles)
    monkeypatch.setitem(tuner.__dict__, "do_bench", timed)
    # Time every candidate even where an earlier run on this machine left its pick in Triton's disk cache
    # (a second GPU suite on one machine found it there and timed nothing).
    monkeypatch.setattr(tuner, "cache_results", False)
    q, k, v = make_qkv(1, 2, 2, 130, 97, head_dim, torch.float16, DEVICE, requires_grad=False)
    launch.attention_forward(q, k, v, True, 0.125, autotune=True)
    o64, _ = attention_ref(*(x.double() for x in (q, k, v)), is_causal=True, scale=0.125)
    low_o, _ = attention_ref(q, k, v, is_causal=True, scale=0.125, upcast=False)
    candidates = autotune.FORWARD_CANDIDATES[autotune.width_class(head_dim, q.dtype)]
    assert {(m, n) for m, n, _ in launches} == {(c.block_m, c.block_n) for c in candidates}
    assert len({(c.block_m, c.block_n) for c in candidates if c.use_tma}) > 1
    for m, n, o in launches:
        check = bounded(f"O at {m}x{n}", o, o64, low_o, q.dtype)
        assert check.ok, str(check)
    reset()
    tuner.cache.clear()


def test_a_cached_pick_of_another_tile_gets_its_boxes():
    """Triton's autotuner launches a pick found in its (disk) cache without timing anything and without
    calling its pre_hook: the launch must still set the descriptors' boxes to the pick's tiles, which
    here differ from the ones the launcher built the descriptors at (the first TMA candidate's)."""
    tuner = autotune.autotuner("fwd", launch.DEFAULT_KERNELS.forward, True)
    tuner.cache.clear()
    reset()
    q, k, v = make_qkv(1, 2, 2, 97, 130, 64, torch.float16, DEVICE, requires_grad=False)
    launch.attention_forward(q, k, v, False, 0.125, autotune=True)
    (key,) = tuner.cache
    built_at = autotune.tma_candidate_tile("fwd", 64, q.dtype)
    other = next(c for c in tuner.configs if c.kwargs["USE_TMA"] and autotune.tile_config_of(c).block_m != built_at[0])
    reset()  # (which empties the autotuners' memory too: the pick is planted after it)
    tuner.cache[key] = other  # what check_disk_cache does on a hit
    o, _ = launch.attention_forward(q, k, v, False, 0.125, autotune=True)
    assert str(launch.last_choice("forward")) == autotune.tile_config_of(other).name
    o64, _ = attention_ref(*(x.double() for x in (q, k, v)), is_causal=False, scale=0.125)
    low_o, _ = attention_ref(q, k, v, is_causal=False, scale=0.125, upcast=False)
    check = bounded("O", o, o64, low_o, q.dtype)
    assert check.ok, str(check)
    tuner.cache.clear()
    reset()


def test_a_tuned_key_skips_the_autotuner(monkeypatch):
    """run_autotuned sends a key through Triton's autotuner once, then launches its pick directly: the
    same tiles, the same numbers, and the logs still name the pick."""
    tuner = autotune.autotuner("fwd", launch.DEFAULT_KERNELS.forward, True)
    tuner.cache.clear()
    reset()
    through_autotuner = []
    run = tuner.run
    monkeypatch.setattr(tuner, "run", lambda *args, **kwargs: through_autotuner.append(1) or run(*args, **kwargs))
    q, k, v = make_qkv(1, 2, 2, 33, 40, 64, torch.float16, DEVICE, requires_grad=False)
    first = launch.attention_forward(q, k, v, True, 0.125, autotune=True)
    picked = str(launch.last_choice("forward"))
    again = launch.attention_forward(q, k, v, True, 0.125, autotune=True)
    assert len(through_autotuner) == 1 and str(launch.last_choice("forward")) == picked
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    launch.attention_forward(q, k, v, False, 0.125, autotune=True)  # another mask: another key
    assert len(through_autotuner) == 2


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_autotuned_backward_matches_reference_and_keys_by_bucket(is_causal):
    tuners = (autotune.autotuner("dkdv", launch.DEFAULT_KERNELS.dkdv, True),
              autotune.autotuner("dq", launch.DEFAULT_KERNELS.dq, True))
    for tuner in tuners:
        tuner.cache.clear()
    reset()
    for seqlen_q, seqlen_k in [(17, 29), (3, 31), (63, 97)]:  # buckets 32, 32, 128
        q, k, v = make_qkv(1, 4, 2, seqlen_q, seqlen_k, 64, torch.float16, DEVICE)
        check_against_reference(lambda q, k, v: with_backward_tiles(q, k, v, is_causal, None, True),
                                q, k, v, is_causal)
        names = {kernel: {c.name for c in autotune.BACKWARD_CANDIDATES[kernel][128]} for kernel in ("dkdv", "dq")}
        dkdv_name, dq_name = str(launch.last_choice("backward")).removeprefix("dK/dV ").split(", dQ ")
        assert dkdv_name in names["dkdv"] and dq_name in names["dq"]
    assert all(len(tuner.cache) == 2 for tuner in tuners)  # (17, 29) and (3, 31) share a bucket


def test_descriptors_match_triton_s_own():
    """attention_descriptors skips TensorDescriptor's checks (host time): it must build the same ones."""
    from triton.tools.tensor_descriptor import TensorDescriptor
    q = torch.randn(2, 3, 40, 64, dtype=torch.bfloat16)[:, :, 4:]  # a view: the base pointer is offset
    strides = descriptors.tma_strides(q, q, q, q)
    assert strides is not None
    ours = descriptors.attention_descriptors((q,) * 4, strides, (64, 32), 64)  # (q, k, v, o) at 64 x 32 tiles
    assert ours == tuple(TensorDescriptor(q, list(q.shape), st, [1, 1, r, 64])
                         for st, r in zip(strides, (64, 32, 32, 64), strict=True))
    assert descriptors.attention_descriptors((q,) * 4, strides, None, 64) == (None,) * 4
    assert descriptors.attention_descriptors((q,) * 4, None, (64, 32), 64) == (None,) * 4


def test_tma_needs_16_byte_aligned_heads_and_rows():
    def tma_ok(t):
        return descriptors.tma_strides(t) is not None
    q = torch.randn(2, 3, 17, 64, dtype=torch.float16)
    assert tma_ok(q)
    wide = torch.randn(2, 3, 17, 65, dtype=torch.float16)[..., :64]  # rows 130 bytes apart
    assert not tma_ok(wide)
    assert not tma_ok(torch.randn(2 * 3 * 17 * 64 + 1, dtype=torch.float16)[1:].view(2, 3, 17, 64))
    one_row = torch.randn(2, 3, 1, 65, dtype=torch.float16)[..., :64]  # a size-1 dim's stride never counts
    assert tma_ok(one_row.contiguous()) and not tma_ok(one_row)  # batch stride 390 bytes
    single = torch.randn(1, 1, 1, 65, dtype=torch.float16)[..., :64]
    assert tma_ok(single)


def test_sweep_prunes_and_replots_old_csvs(tmp_path):
    from pathlib import Path

    from flashtriton.tools.sweep import candidate_configs, heatmap, read_csv
    keep, pruned = candidate_configs(128, torch.bfloat16, SMEM)
    assert keep and pruned and all(why_pruned(c, 128, torch.bfloat16, SMEM) is None for c in keep)
    assert any(c.qk_ahead for c in keep) and not any(c.qk_ahead and c.warp_specialize for c in keep)
    # CSVs written before the qk_ahead variant existed still read, and redraw
    old = Path(__file__).parents[1] / "benchmarks/results/h200/sweeps/sweep_B4-H16-N4096-D128-full.csv"
    results = read_csv(old)
    assert results and not any(r.qk_ahead for r in results)
    if heatmap(results, tmp_path / "replot.png", "replot"):
        assert (tmp_path / "replot.png").stat().st_size > 0


@pytest.mark.parametrize("kernel", ["dkdv", "dq"])
def test_backward_sweep_keeps_the_default_and_varies_one_kernel(kernel, monkeypatch):
    from flashtriton.launch.tiles import backward_configs, why_pruned_backward
    from flashtriton.tools import sweep

    keep, pruned = sweep.candidate_configs(64, torch.bfloat16, SMEM, kernel)
    default = backward_configs(64, torch.bfloat16, torch.device("cuda"))[0 if kernel == "dkdv" else 1]
    assert default in keep and pruned
    assert all(c == default or why_pruned_backward(kernel, c, 64, torch.bfloat16, SMEM) is None for c in keep)
    assert any("8 warps on 64 resident rows" in p for p in pruned)
    # the sweep's run: the config reaches the kernel it names, the other keeps its static tiles
    seen = {}
    monkeypatch.setattr(sweep, "attention_backward", lambda *a: seen.setdefault("configs", a[-1]))
    q = torch.randn(1, 1, 8, 64)
    cfg = TileConfig(16, 16)
    sweep._run(kernel, cfg, q, q, q, False, 1.0, (q, q[..., 0], q))
    static = backward_configs(64, q.dtype, q.device)
    assert seen["configs"] == ((cfg, static[1]) if kernel == "dkdv" else (static[0], cfg))
    # --match narrows the sweep to the names it matches, keeping the default as the yardstick
    narrowed = sweep.matching(keep, r"-w8-s2-tma$", kernel, 64, torch.bfloat16)
    assert default in narrowed and len(narrowed) < len(keep)
    assert all(c.name.endswith("-w8-s2-tma") for c in narrowed if c != default)


def test_autotuning_by_default_only_for_large_work_and_can_be_switched_off(monkeypatch):
    monkeypatch.delenv("FLASHTRITON_AUTOTUNE", raising=False)
    assert autotune.autotune_by_default(autotune.AUTOTUNE_MIN_WORK)
    assert not autotune.autotune_by_default(autotune.AUTOTUNE_MIN_WORK - 1)
    monkeypatch.setenv("FLASHTRITON_AUTOTUNE", "0")
    assert not autotune.autotune_by_default(autotune.AUTOTUNE_MIN_WORK)
