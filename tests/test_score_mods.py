"""Score modifications: softcap (softcap * tanh(s / softcap)) and ALiBi (-slope * |i + Nk - Nq - j|), alone,
together, with the causal mask and sliding windows, through the forward and both backward kernels."""

import pytest
import torch

from conftest import DEVICE, ON_GPU
from flashtriton import flash_attention
from flashtriton.launch import TileConfig
from helpers import BackwardTiles, check_against_reference, make_qkv

SIZES = [(97, 63), (63, 97), (1, 17)] if not ON_GPU else [(1000, 700), (700, 1000), (1, 300)]
HEADS = (4, 2) if ON_GPU else (2, 1)  # (query, key/value) heads: GQA; the interpreter's time grows with them


def _slopes(shape):
    """ALiBi's geometric slopes for the heads, as the paper sets them, times a per-batch factor if 2-D."""
    heads = shape[-1]
    slopes = torch.tensor([2.0 ** (-8.0 * (h + 1) / heads) for h in range(heads)])
    if len(shape) == 2:
        slopes = slopes * torch.linspace(0.5, 1.5, shape[0])[:, None]
    return slopes.float().to(DEVICE)


@pytest.mark.parametrize("softcap,alibi", [(5.0, None), (0.0, ()), (0.0, (2,)), (2.0, (2,))],
                         ids=["softcap", "alibi", "alibi-per-batch", "both"])
@pytest.mark.parametrize("is_causal,window", [(False, (-1, -1)), (True, (-1, -1)), (False, (9, 20))],
                         ids=["full", "causal", "window"])
def test_score_mods_match_reference(softcap, alibi, is_causal, window):
    slopes = None if alibi is None else _slopes((*alibi, HEADS[0]))  # (Hq,) or per batch (2, Hq)
    for seqlen_q, seqlen_k in SIZES:
        q, k, v = make_qkv(2, *HEADS, seqlen_q, seqlen_k, 32, torch.bfloat16, DEVICE)
        check_against_reference(
            lambda q, k, v: flash_attention(q, k, v, is_causal=is_causal, window_size=window, softcap=softcap,
                                            alibi_slopes=slopes, return_lse=True),
            q, k, v, is_causal, window_size=window, softcap=softcap, alibi_slopes=slopes)


def test_softcap_bounds_the_scores():
    """With a small cap every score lies in (-cap, cap): the row's logsumexp is at most cap + log(Nk)."""
    q, k, v = make_qkv(1, 2, 2, 40, 50, 64, torch.float32, DEVICE, requires_grad=False)
    q = q * 30  # scores far beyond the cap
    _, lse = flash_attention(q, k, v, softcap=1.5, return_lse=True)
    assert torch.all(lse <= 1.5 + torch.log(torch.tensor(50.0)) + 1e-4)


@pytest.mark.parametrize("configs", [(TileConfig(16, 32, use_tma=True), TileConfig(32, 16, use_tma=True)),
                                     (TileConfig(16, 32), TileConfig(32, 16)), None],
                         ids=["tma", "pointer-loads", "autotuned"])
def test_score_mods_on_every_backward_path(configs):
    slopes = _slopes((4,))
    q, k, v = make_qkv(1, 4, 1, 61, 77, 64, torch.float16, DEVICE)
    options = dict(scale=0.125, softcap=3.0, alibi_slopes=slopes)

    def modded(q, k, v):
        return BackwardTiles.apply(q, k, v, True, options, configs, configs is None)
    check_against_reference(modded, q, k, v, True, scale=0.125, softcap=3.0, alibi_slopes=slopes)


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(softcap=-1.0), ValueError, "finite positive cap"), (dict(softcap=float("inf")), ValueError, "finite"),
    (dict(softcap="1"), TypeError, "softcap must be a number"), (dict(softcap=True), TypeError, "number"),
    (dict(alibi_slopes=[0.5, 0.25]), TypeError, "alibi_slopes must be a torch.Tensor"),
    (dict(alibi_slopes=torch.ones(2, dtype=torch.float64)), TypeError, "float32"),
    (dict(alibi_slopes=torch.ones(3)), ValueError, r"shape \(2,\) or \(1, 2\)"),
    (dict(alibi_slopes=torch.ones(2, 2)), ValueError, "shape"),
])
def test_bad_score_mods_are_clear_errors(kwargs, error, match):
    q, k, v = make_qkv(1, 2, 2, 8, 8, 16, torch.float32, DEVICE, requires_grad=False)
    if "alibi_slopes" in kwargs and isinstance(kwargs["alibi_slopes"], torch.Tensor):
        kwargs = dict(alibi_slopes=kwargs["alibi_slopes"].to(DEVICE))
    with pytest.raises(error, match=match):
        flash_attention(q, k, v, **kwargs)
