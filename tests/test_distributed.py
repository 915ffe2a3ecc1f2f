"""Context parallelism (flashtriton.distributed) on CPU: 2 and 3 gloo processes, the kernels through
Triton's interpreter. Each rank takes its shard of the same whole inputs and compares its rows of O, L
and of dQ, dK, dV with the float64 reference on the whole sequence, bounded by twice the error of
single-process `flash_attention` on it. Also the layouts' round trips, and errors that must reach every
rank (a bad shape on one rank) instead of leaving the others waiting."""

import importlib.util
import json
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from conftest import ON_GPU
from flashtriton import flash_attention
from flashtriton.distributed import (
    contiguous_shard,
    contiguous_unshard,
    ring_attention,
    ulysses_attention,
    zigzag_ring_flash_attn_func,
    zigzag_shard,
    zigzag_unshard,
)
from flashtriton.testing import check_shard

pytestmark = pytest.mark.skipif(ON_GPU, reason="the gloo tests run on CPU; the GPU runs the cp suite")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank, world, port, worker, args):
    os.environ["TRITON_INTERPRET"] = "1"
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        worker(rank, world, *args)
    finally:
        dist.destroy_process_group()


def _spawn(world, worker, *args):
    mp.spawn(_entry, args=(world, _free_port(), worker, args), nprocs=world, join=True)


def _whole(heads_q, heads_kv, seqlen, dtype, seed):
    """The same whole q, k, v and dO on every rank."""
    generator = torch.Generator().manual_seed(seed)
    q, do = (torch.randn(1, heads_q, seqlen, 16, generator=generator).to(dtype) for _ in range(2))
    k, v = (torch.randn(1, heads_kv, seqlen, 16, generator=generator).to(dtype) for _ in range(2))
    return q, k, v, do


def _check_rank(attend, shard, whole, reference_kwargs, kernel_kwargs):
    """This rank's rows of O, L and gradients from `attend` on its shards, against float64 on the whole
    sequence, allowed twice single-process flash_attention's error there."""
    def attend_whole(q, k, v):
        return flash_attention(q, k, v, return_lse=True, **kernel_kwargs)
    failed = [str(check) for check, _ in check_shard(attend, attend_whole, shard, whole, reference_kwargs)
              if not check.ok]
    assert not failed, failed


def test_check_shard_catches_a_wrong_shard():
    """The check the ranks and the GPU's cp suite run, on one 'rank' holding everything: exact for the
    right call, failing for one that drops the causal mask."""
    whole = _whole(2, 2, 9, torch.float32, seed=5)

    def causal(q, k, v):
        return flash_attention(q, k, v, is_causal=True, return_lse=True)
    good = check_shard(causal, causal, lambda x: x, whole, dict(is_causal=True))
    assert all(check.ok and diff == 0 for check, diff in good), good
    bad = check_shard(lambda *t: flash_attention(*t, return_lse=True), causal, lambda x: x, whole,
                      dict(is_causal=True))
    assert not any(check.ok for check, _ in bad[:2]) and bad[0][1] > 1e-2, bad


RING_CASES = [  # (layout, causal, heads_q, heads_kv, dtype, softcap, window)
    ("zigzag", True, 4, 2, torch.bfloat16, 0.0, (-1, -1)),
    ("zigzag", False, 2, 2, torch.float32, 5.0, (-1, -1)),
    ("contiguous", True, 2, 1, torch.bfloat16, 0.0, (-1, -1)),
    ("zigzag", True, 2, 1, torch.float32, 0.0, (7, 0)),  # across chunks and ranks
    ("zigzag", False, 2, 2, torch.bfloat16, 0.0, (2, 6)),
    ("contiguous", False, 2, 2, torch.float32, 3.0, (4, -1)),
    ("contiguous", True, 2, 2, torch.float32, 0.0, (3, 2)),  # causal caps the right side at 0
]


def _ring_worker(rank, world, cases, chunk):
    for i, (layout, causal, heads_q, heads_kv, dtype, softcap, window) in enumerate(cases):
        whole = _whole(heads_q, heads_kv, 2 * world * chunk, dtype, seed=i)
        shard_fn = zigzag_shard if layout == "zigzag" else contiguous_shard

        def shard(x, shard_fn=shard_fn):
            return shard_fn(x, dim=2)
        flags = dict(is_causal=causal, softcap=softcap, window_size=window)
        _check_rank(lambda q, k, v, layout=layout, flags=flags: ring_attention(q, k, v, layout=layout, return_lse=True,
                                                                               **flags),
                    shard, whole, flags, flags)


@pytest.mark.parametrize("world,chunk", [(2, 5), (3, 3)])
def test_ring_attention_matches_the_whole_sequence(world, chunk):
    _spawn(world, _ring_worker, RING_CASES if world == 2 else RING_CASES[:1] + RING_CASES[3:4], chunk)


def _ulysses_worker(rank, world, heads_q, heads_kv, cases):
    slopes = torch.rand(heads_q, generator=torch.Generator().manual_seed(0))  # the same on every rank
    every = [dict(is_causal=True), dict(is_causal=True, window_size=(3, 0), softcap=4.0), dict(alibi_slopes=slopes)]
    for i, flags in enumerate(every[:cases]):
        whole = _whole(heads_q, heads_kv, world * 7, torch.bfloat16 if i == 0 else torch.float32, seed=10 + i)
        _check_rank(lambda q, k, v, flags=flags: ulysses_attention(q, k, v, return_lse=True, **flags),
                    lambda x: contiguous_shard(x, dim=2), whole, flags, flags)


@pytest.mark.parametrize("world,heads_q,heads_kv", [(2, 4, 2), (3, 6, 3)])
def test_ulysses_attention_matches_the_whole_sequence(world, heads_q, heads_kv):
    _spawn(world, _ulysses_worker, heads_q, heads_kv, 3 if world == 2 else 1)


def _layouts_and_interface_worker(rank, world):
    x = torch.arange(2 * 4 * world * 2 * 3, dtype=torch.float32).view(2, 4, world * 2 * 3, 1)
    assert torch.equal(zigzag_unshard(zigzag_shard(x), dim=2), x)
    assert torch.equal(contiguous_unshard(contiguous_shard(x), dim=2), x)
    chunks = x.chunk(2 * world, dim=2)
    assert torch.equal(zigzag_shard(x), torch.cat([chunks[rank], chunks[2 * world - 1 - rank]], 2))
    with pytest.raises(ValueError, match="pad the sequence"):
        zigzag_shard(x[:, :, :-1])
    # ring-flash-attn's function, (B, N, H, D), against ring_attention on the same shards
    q, k, v, _ = _whole(2, 2, 4 * world, torch.float32, seed=3)
    mine = [zigzag_shard(t) for t in (q, k, v)]
    o = zigzag_ring_flash_attn_func(*(t.transpose(1, 2) for t in mine), causal=True)
    assert torch.equal(o.transpose(1, 2), ring_attention(*mine, is_causal=True))


def test_layouts_round_trip_and_the_ring_flash_attn_interface():
    _spawn(2, _layouts_and_interface_worker)


def _ring_flash_attn_peer_worker(rank, world):
    from flashtriton.tools.ring_flash_attn_peer import load_zigzag_ring
    peer = load_zigzag_ring()

    def attend(q, k, v):  # (B, H, n, D) shards in, flash_attn's (B, n, H, D) to the peer
        o, lse, _ = peer(*(t.transpose(1, 2) for t in (q, k, v)), causal=True, return_attn_probs=True)
        return o.transpose(1, 2), lse

    def attend_whole(q, k, v):
        return flash_attention(q, k, v, is_causal=True, return_lse=True)
    whole = _whole(4, 2, 2 * world * 5, torch.bfloat16, seed=7)
    checks = check_shard(attend, attend_whole, lambda x: zigzag_shard(x, dim=2), whole, dict(is_causal=True))
    failed = [str(check) for check, _ in checks if not check.ok]
    assert not failed, failed


def test_ring_flash_attn_runs_on_flashtriton_kernels():
    """The cp suite's peer: ring-flash-attn's zigzag ring, its block calls on our kernels (tools/
    ring_flash_attn_peer.py), exact on 2 gloo ranks with GQA."""
    if importlib.util.find_spec("ring_flash_attn") is None:  # importing it needs flash_attn: the peer loads it
        pytest.skip("the `cp` extra: pip install ring-flash-attn")
    _spawn(2, _ring_flash_attn_peer_worker)


def _errors_worker(rank, world):
    q, k, v, _ = _whole(2, 2, 8, torch.float32, seed=4)
    bad = q[:, :, :6] if rank == 1 else q[:, :, :4]  # rank 1 alone passes another length
    with pytest.raises(ValueError, match="rank 1"):
        ring_attention(bad, k[:, :, :4], v[:, :, :4])
    wrong_dtype = q.to(torch.float16) if rank == 0 else q  # rank 0's own check fails; rank 1's passes
    with pytest.raises(TypeError, match="rank 0: .*dtype"):
        ring_attention(wrong_dtype[:, :, :4], k[:, :, :4], v[:, :, :4])
    with pytest.raises(NotImplementedError, match="ALiBi"):
        ring_attention(q[:, :, :4], k[:, :, :4], v[:, :, :4], alibi_slopes=torch.ones(2))
    with pytest.raises(ValueError, match="local length must be even"):
        ring_attention(q[:, :, :3], k[:, :, :3], v[:, :, :3])
    with pytest.raises(ValueError, match="equal share of the heads"):
        ulysses_attention(q[:, :1, :4], k[:, :1, :4], v[:, :1, :4])
    with pytest.raises(ValueError, match="layout must be one of"):
        ring_attention(q[:, :, :4], k[:, :, :4], v[:, :, :4], layout="stripe")


def test_a_bad_call_on_one_rank_raises_on_every_rank():
    _spawn(2, _errors_worker)


def _cp_suite_worker(rank, world, out):
    from flashtriton.tools import cp_bench
    rows = cp_bench.cp_rows(seqlens=(8,), batch=1, heads=2, head_dim=16, dtype=torch.float32,
                            calls_and_rounds=lambda seqlen: (1, 1))
    # bf16, as on the GPU: ring-flash-attn takes flash_attn's dtypes only (in float32 its dQ accumulator
    # aliases its block buffer, `dq_buffer.to(torch.float32)` being no copy)
    exactness = cp_bench.cp_exactness(batch=1, heads=2, seqlen=12, head_dim=16, dtype=torch.bfloat16)
    assert set(rows[0]["efficiency"]) == {f"{name} {mode}" for name in exactness for mode in ("fwd", "fwd_bwd")}
    assert all(v > 0 for v in rows[0]["ms"].values()) and all(len(v) == world for v in rows[0]["ms_per_rank"].values())
    assert ("ring-flash-attn (zigzag)" in exactness) == (world > 1 and importlib.util.find_spec("ring_flash_attn")
                                                        is not None)
    assert all(f["ok"] for found in exactness.values() for f in found.values()), exactness
    assert cp_bench.cp_table(rows).count("\n") == 3  # a header, its rule and a row per mode
    if rank == 0:
        meta = dict(commit="test", gpu="cpu", torch=torch.__version__)
        (out / f"cp_g{world}.json").write_text(json.dumps(dict(meta=meta, rows=rows, exactness=exactness)))


@pytest.mark.parametrize("world", [1, 2])
def test_cp_suite_times_checks_and_reports(tmp_path, world):
    """The cp suite's parts on 1 and 2 gloo ranks at a tiny size (every provider, both modes, the
    exactness check), then its report; the traced overlap needs CUDA (its arithmetic is tested below)."""
    from flashtriton.tools.cp_bench import cp_report
    _spawn(world, _cp_suite_worker, tmp_path)
    text = cp_report(tmp_path)
    assert f"## G = {world} (commit test" in text and "| ring (zigzag) | dK |" in text and " NO " not in text


def test_transfer_overlap_counts_what_runs_beside_the_transfers():
    from flashtriton.tools.transfer_overlap import transfer_overlap

    def kernel(name, start, end, cat="kernel"):
        return dict(ph="X", cat=cat, name=name, ts=start, dur=end - start)
    events = [kernel("attention_forward", 0, 100), kernel("attention_forward", 90, 150),  # compute 0-150
              kernel("ncclDevKernel_SendRecv", 40, 120),  # 80 us, all hidden
              kernel("ncclDevKernel_SendRecv", 140, 200),  # 60 us, 10 hidden
              kernel("Memcpy PtoP (Device -> Device)", 210, 230, cat="gpu_memcpy"),  # 20 us exposed
              dict(ph="X", cat="cpu_op", name="aten::add", ts=0, dur=1000)]  # the host's: ignored
    found = transfer_overlap(events)
    assert found["transfer_us"] == 160 and found["hidden_us"] == 90 and found["exposed_us"] == 70
    assert found["compute_us"] == 150 and found["step_us"] == 230
    assert abs(found["hidden_fraction"] - 90 / 160) < 1e-12
    assert transfer_overlap([])["hidden_fraction"] is None


def test_a_cp_run_joins_an_earlier_run_of_its_commit():
    from flashtriton.tools.cp_bench import merged_run

    def run(commit, lengths, overlap):
        return dict(meta=dict(commit=commit), rows=[dict(seqlen=n, ms=commit) for n in lengths], overlap=overlap)
    joined = merged_run(run("b", [524288, 32768], {}), run("b", [32768, 131072], {"seqlen": 131072}))
    assert [(r["seqlen"], r["ms"]) for r in joined["rows"]] == [(32768, "b"), (131072, "b"), (524288, "b")]
    assert joined["overlap"] == {"seqlen": 131072}
    assert merged_run(run("b", [8], {}), run("a", [16], {"x": 1})) == run("b", [8], {})
    assert merged_run(run("b", [8], {}), None) == run("b", [8], {})


def test_the_ring_flash_attn_peer_refuses_what_the_ring_does_not_take():
    from flashtriton.tools.ring_flash_attn_peer import _flash_attn_forward
    q = torch.randn(1, 4, 2, 16)
    with pytest.raises(NotImplementedError, match="dropout_p=0, got dropout_p=0.1"):
        _flash_attn_forward(q, q, q, 0.1, 0.25, True)
    with pytest.raises(NotImplementedError, match=r"alibi_slopes=None, got a tensor of shape \(2,\)"):
        _flash_attn_forward(q, q, q, 0.0, 0.25, True, alibi_slopes=torch.ones(2))
