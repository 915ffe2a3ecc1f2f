"""PyTorch references: the plain attention the tests trust, and the tiled FlashAttention-2 in PyTorch.

`attention_ref` materialises the full score matrix; it is the oracle (run it in float64).
`FlashAttentionPytorch` is the algorithm the Triton kernels implement, written with tensor ops so it can be
read and stepped through: the forward streams key tiles through an online softmax and keeps only the
logsumexp `L`; the backward recomputes `P = exp(S - L)` tile by tile and never builds an N x N matrix.

Causal masks are aligned to the bottom-right corner, as in flash_attn >= 2.1: with `Nq` queries and `Nk`
keys, query i sees key j iff `j <= i + (Nk - Nq)`. When Nq > Nk the first `Nq - Nk` queries see no key at
all; their output is 0 and their logsumexp is -inf::

    Nq = 3, Nk = 5          Nq = 5, Nk = 3
    q0  x x x . .           q0  . . .      (no key: O = 0, L = -inf)
    q1  x x x x .           q1  . . .
    q2  x x x x x           q2  x . .
                            q3  x x .
                            q4  x x x
"""

from __future__ import annotations

import math

import torch

__all__ = ["attention_ref", "FlashAttentionPytorch"]


def _visible(n_q: int, n_k: int, is_causal: bool, device: torch.device,
             window_size: tuple[int, int] = (-1, -1)) -> torch.Tensor | None:
    """Boolean (Nq, Nk) matrix of which keys each query sees; None when it sees all of them. With
    `window_size=(left, right)` query i sees key j iff i + d - left <= j <= i + d + right, d = Nk - Nq,
    -1 meaning unbounded; causal is right = 0, and both together take the intersection."""
    left, right = window_size
    if not is_causal and left < 0 and right < 0:
        return None
    rows = torch.arange(n_q, device=device)[:, None] + (n_k - n_q)
    cols = torch.arange(n_k, device=device)[None, :]
    visible = torch.ones(n_q, n_k, dtype=torch.bool, device=device)
    if is_causal:
        visible &= cols <= rows
    if right >= 0:
        visible &= cols <= rows + right
    if left >= 0:
        visible &= cols >= rows - left
    return visible


def attention_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    is_causal: bool = False,
    scale: float | None = None,
    upcast: bool = True,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    dropout_mask: torch.Tensor | None = None,
    return_probs: bool = False,
) -> tuple[torch.Tensor, torch.Tensor] | tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Plain softmax attention that materialises the scores. Returns `(o, lse)`.

    q: (..., Hq, Nq, D); k, v: (..., Hkv, Nk, D) with Hq a multiple of Hkv (GQA: each group of
    Hq / Hkv query heads shares one key/value head). o: like q; lse: (..., Hq, Nq), natural log, float32
    (float64 for float64 inputs).

    With `upcast=True` everything is computed in float64, the oracle the tests compare against. With
    `upcast=False` it runs in the inputs' own dtype: the error of that "plain attention in low precision"
    is the yardstick a kernel's error is bounded by. Rows that see no key give o = 0, lse = -inf and zero
    gradients (no NaN), matching the kernels. `window_size=(left, right)` is a sliding window aligned
    like the causal mask (see `flash_attention`); `softcap` > 0 replaces each scaled score s by
    softcap * tanh(s / softcap); `alibi_slopes` ((Hq,) or (B, Hq)) subtracts slope * |i + Nk - Nq - j|.
    With `dropout_mask` (boolean, like the scores: True where a probability is kept) the product with v
    uses P * mask / (1 - dropout_p); lse stays the full softmax's. `return_probs` also returns those
    (dropped and rescaled) probabilities.
    """
    dtype = q.dtype
    if upcast:
        q, k, v = q.double(), k.double(), v.double()
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    group = q.shape[-3] // k.shape[-3]
    if group > 1:  # (..., Hkv, Nk, D) -> (..., Hq, Nk, D): query head h reads key head h // group
        k = k.repeat_interleave(group, dim=-3)
        v = v.repeat_interleave(group, dim=-3)

    if k.shape[-2] == 0:  # no keys at all: every row sees none
        lse = torch.full(q.shape[:-1], float("-inf"), dtype=torch.float64 if dtype == torch.float64 else torch.float32,
                         device=q.device)
        return (q * 0).to(dtype), lse
    s = (q @ k.transpose(-2, -1)) * scale  # (..., Hq, Nq, Nk)
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    if alibi_slopes is not None:
        n_q, n_k = q.shape[-2], k.shape[-2]
        distance = (torch.arange(n_q, device=q.device)[:, None] + (n_k - n_q)
                    - torch.arange(n_k, device=q.device)[None, :]).abs().to(s.dtype)
        s = s - alibi_slopes.to(s.dtype)[..., None, None] * distance
    visible = _visible(q.shape[-2], k.shape[-2], is_causal, q.device, window_size)
    if visible is not None:
        s = s.masked_fill(~visible, float("-inf"))
    # Softmax written out so that rows with no visible key give 0 instead of NaN, in value and gradient.
    m = s.amax(dim=-1, keepdim=True).detach()
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    e = torch.exp(s - m)
    denom = e.sum(dim=-1, keepdim=True)
    p = e / torch.where(denom == 0, torch.ones_like(denom), denom)
    if dropout_mask is not None:
        p = p * dropout_mask.to(p.dtype) / (1.0 - dropout_p)
    o = p @ v
    # L is differentiable (dL_i / ds_ij = P_ij, the undropped softmax) so tests can take gradients through it.
    empty = denom == 0
    safe_denom = torch.where(empty, torch.ones_like(denom), denom)
    lse = torch.where(empty, float("-inf"), torch.log(safe_denom) + m).squeeze(-1)
    lse = lse.to(torch.float64 if dtype == torch.float64 else torch.float32)
    if return_probs:
        return o.to(dtype), lse, p
    return o.to(dtype), lse


class FlashAttentionPytorch(torch.autograd.Function):
    """FlashAttention-2 in PyTorch: tiled forward with online softmax, tiled backward from `L`.

    `FlashAttentionPytorch.apply(Q, K, V, is_causal=False, scale=None, tile_q=16, tile_k=16)` returns O.
    Q: (..., Nq, d), K and V: (..., Nk, d) with the same leading dims; O: like Q. Any Nq, Nk (not only
    multiples of the tile). Tiles are computed in float32; O is returned in Q's dtype. Saves exactly
    `Q, K, V, O, L` for the backward, L of shape Q.shape[:-1] in float32.
    """

    @staticmethod
    def forward(ctx, Q, K, V, is_causal=False, scale=None, tile_q=16, tile_k=16):
        from .validation import check_inputs, check_scale
        check_inputs(Q, K, V, is_causal=is_causal, kernels=False)
        if K.shape[:-2] != Q.shape[:-2]:
            raise ValueError(f"FlashAttentionPytorch needs equal leading dims (no GQA), got q {tuple(Q.shape)} and "
                             f"k {tuple(K.shape)}; repeat k and v's heads, or use flash_attention")
        for name, tile in (("tile_q", tile_q), ("tile_k", tile_k)):
            if isinstance(tile, bool) or not isinstance(tile, int) or tile < 1:
                raise ValueError(f"{name} must be a positive int (rows per tile), got {tile!r}")
        n_q, n_k = Q.shape[-2], K.shape[-2]
        scale = check_scale(scale, Q.shape[-1])
        diag = n_k - n_q  # query i sees key j iff j <= i + diag (when causal)
        O = torch.empty_like(Q)
        L = torch.empty(Q.shape[:-1], device=Q.device, dtype=torch.float32)

        for q0 in range(0, n_q, tile_q):  # outer loop: query tiles (one Triton program each)
            q1 = min(q0 + tile_q, n_q)
            Q_i = Q[..., q0:q1, :].float()
            O_i = torch.zeros_like(Q_i)  # unnormalised: divided by l once, at the end
            l_i = torch.zeros(Q_i.shape[:-1] + (1,), device=Q.device)
            m_i = torch.full_like(l_i, float("-inf"))
            # Causal: keys past the tile's last row + diag are invisible to every row, so stop there.
            k_end = min(n_k, q1 + diag) if is_causal else n_k
            for k0 in range(0, max(k_end, 0), tile_k):  # inner loop: key tiles
                k1 = min(k0 + tile_k, n_k)
                S_ij = (Q_i @ K[..., k0:k1, :].float().transpose(-2, -1)) * scale
                if is_causal:
                    rows = torch.arange(q0, q1, device=Q.device)[:, None]
                    cols = torch.arange(k0, k1, device=Q.device)[None, :]
                    S_ij = S_ij.masked_fill(cols > rows + diag, float("-inf"))
                m_new = torch.maximum(m_i, S_ij.amax(dim=-1, keepdim=True))
                # A row that has seen no visible key yet keeps m = -inf: shift by 0 so exp gives 0, not NaN.
                m_shift = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
                P_ij = torch.exp(S_ij - m_shift)
                alpha = torch.exp(m_i - m_shift)  # rescales the old state to the new running max
                l_i = alpha * l_i + P_ij.sum(dim=-1, keepdim=True)
                O_i = alpha * O_i + P_ij @ V[..., k0:k1, :].float()
                m_i = m_new
            empty = l_i == 0  # rows that saw no key: O = 0, L = -inf
            O[..., q0:q1, :] = (O_i / torch.where(empty, torch.ones_like(l_i), l_i)).to(Q.dtype)
            L[..., q0:q1] = torch.where(empty, float("-inf"), m_i + torch.log(l_i)).squeeze(-1)

        ctx.save_for_backward(Q, K, V, O, L)
        ctx.is_causal, ctx.scale, ctx.tiles = is_causal, scale, (tile_q, tile_k)
        return O

    @staticmethod
    def backward(ctx, dO):
        Q, K, V, O, L = ctx.saved_tensors
        tile_q, tile_k = ctx.tiles
        scale, is_causal = ctx.scale, ctx.is_causal
        n_q, n_k = Q.shape[-2], K.shape[-2]
        diag = n_k - n_q
        dO = dO.float()
        D = (dO * O.float()).sum(dim=-1, keepdim=True)  # rowsum(dO * O), shape (..., Nq, 1)
        L = L.unsqueeze(-1)
        dQ = torch.zeros(Q.shape, device=Q.device, dtype=torch.float32)
        dK = torch.zeros(K.shape, device=K.device, dtype=torch.float32)
        dV = torch.zeros(V.shape, device=V.device, dtype=torch.float32)

        for k0 in range(0, n_k, tile_k):  # outer loop: key tiles (one Triton program each for dK, dV)
            k1 = min(k0 + tile_k, n_k)
            K_j, V_j = K[..., k0:k1, :].float(), V[..., k0:k1, :].float()
            # Causal: rows before k0 - diag see none of these keys, so start there.
            q_start = max(k0 - diag, 0) if is_causal else 0
            for q0 in range(q_start - q_start % tile_q, n_q, tile_q):
                q1 = min(q0 + tile_q, n_q)
                S_ij = (Q[..., q0:q1, :].float() @ K_j.transpose(-2, -1)) * scale
                P_ij = torch.exp(S_ij - L[..., q0:q1, :])
                if is_causal:
                    rows = torch.arange(q0, q1, device=Q.device)[:, None]
                    cols = torch.arange(k0, k1, device=Q.device)[None, :]
                    # where, not multiply: rows with L = -inf have exp(S - L) = inf under the mask.
                    P_ij = torch.where(cols > rows + diag, torch.zeros_like(P_ij), P_ij)
                dO_i = dO[..., q0:q1, :]
                dV[..., k0:k1, :] += P_ij.transpose(-2, -1) @ dO_i
                dS_ij = P_ij * (dO_i @ V_j.transpose(-2, -1) - D[..., q0:q1, :])
                dK[..., k0:k1, :] += scale * dS_ij.transpose(-2, -1) @ Q[..., q0:q1, :].float()
                dQ[..., q0:q1, :] += scale * dS_ij @ K_j
        return dQ.to(Q.dtype), dK.to(K.dtype), dV.to(V.dtype), None, None, None, None
