"""Shared references for the flexc.torch tests: attention computed densely in float64 from the
materialised mask (mask_mod evaluated on the whole grid) and the score_mod's torch form."""
import os
import sys

import pytest
import torch

# The package under test: python/ of this tree unless an installed flexc is asked for.
if not os.environ.get("FLEXC_TEST_INSTALLED"):
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))


def dense_mask(mask_mod, B, H, q_pos, kv_len):
    """[B, H, Lq, Lkv] bool: mask_mod at every (b, h, q, kv)."""
    b = torch.arange(B).view(B, 1, 1, 1)
    h = torch.arange(H).view(1, H, 1, 1)
    q = q_pos.view(1, 1, -1, 1)
    kv = torch.arange(kv_len).view(1, 1, 1, -1)
    return torch.broadcast_to(mask_mod(b, h, q, kv), (B, H, q_pos.numel(), kv_len))


def reference_attention(q, k, v, mask_mod=None, score_mod=None, scale=None, q_offset=0):
    """out, lse in the inputs' dtype (use float64), differentiable; rows that see no key give
    out 0 and lse -inf."""
    B, Hq, Lq, D = q.shape
    Hkv, Lkv = k.shape[1], k.shape[2]
    G = Hq // Hkv
    k = k.repeat_interleave(G, dim=1)
    v = v.repeat_interleave(G, dim=1)
    s = (q @ k.transpose(-1, -2)) * (scale if scale is not None else 1.0 / D ** 0.5)
    q_pos = torch.arange(q_offset, q_offset + Lq)
    if score_mod is not None:
        b = torch.arange(B).view(B, 1, 1, 1)
        h = torch.arange(Hq).view(1, Hq, 1, 1)
        s = score_mod(s, b, h, q_pos.view(1, 1, -1, 1), torch.arange(Lkv).view(1, 1, 1, -1))
    if mask_mod is not None:
        keep = dense_mask(mask_mod, B, Hq, q_pos, Lkv)
        s = s.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - torch.where(torch.isinf(lse), torch.zeros_like(lse), lse).unsqueeze(-1))
    return p @ v, lse


def assert_close(got, want, what, atol=2e-5, rtol=2e-4):
    got, want = got.detach().double(), want.detach().double()
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    both_inf = torch.isinf(got) & torch.isinf(want) & (torch.sign(got) == torch.sign(want))
    err = torch.where(both_inf, torch.zeros_like(got), (got - want).abs())
    err = torch.nan_to_num(err, nan=float("inf"))
    bad = err > atol + rtol * want.abs().nan_to_num(0, 0, 0)
    if bad.any():
        idx = tuple(int(i) for i in bad.nonzero()[0])
        pytest.fail(f"{what}: largest error {err.max().item():.3g}, first mismatch at {idx}: "
                    f"got {got[idx].item()}, want {want[idx].item()}")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
