"""score_mod and mask_mod written by the user, traced into flexc's mod expressions: values and
gradients (q, k, v and the captured tensors) against dense attention with the same function
applied by PyTorch in float64; what cannot be traced raises a TypeError naming it."""
import math

import pytest
import torch

import flexc
import flexc.torch as ft


def dense(q, k, v, score_mod=None, mask_mod=None):
    """Attention with the mods applied by broadcasting the positions, in q's dtype."""
    B, H, L, E = q.shape
    S, G = k.shape[2], H // k.shape[1]
    k, v = k.repeat_interleave(G, 1), v.repeat_interleave(G, 1)
    s = (q @ k.transpose(-1, -2)) / math.sqrt(E)
    b = torch.arange(B).view(B, 1, 1, 1)
    h = torch.arange(H).view(1, H, 1, 1)
    qi = torch.arange(L).view(1, 1, L, 1)
    ki = torch.arange(S).view(1, 1, 1, S)
    if score_mod is not None:
        s = score_mod(s, b, h, qi, ki)
    if mask_mod is not None:
        s = s.masked_fill(~torch.broadcast_to(mask_mod(b, h, qi, ki), s.shape), float("-inf"))
    p = torch.softmax(s, -1).nan_to_num(0.0)  # a fully masked row gives 0
    return p @ v


def leaves(*ts):
    return [t.detach().clone().requires_grad_(True) for t in ts]


def check(score_fn, mask_fn=None, captured=(), B=2, H=4, Hkv=2, L=70, S=70, E=16, seed=0, bm=None):
    """flexc against the float64 reference: out, and the gradients of q, k, v and of each
    captured float tensor (score_fn(params) / mask_fn(params) build the mods over them)."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, n, l, E, generator=g) for n, l in ((H, L), (Hkv, S), (Hkv, S)))
    dout = torch.randn(B, H, L, E, generator=g)
    params = leaves(*captured)
    params64 = [p.detach().double().requires_grad_(True) if p.is_floating_point() else p for p in params]
    qf, kf, vf = leaves(q, k, v)
    mask = None
    if mask_fn is not None:
        mask = ft.create_block_mask(mask_fn(params), B, H, L, S, BLOCK_SIZE=bm or 32)
    sm = score_fn(params) if score_fn is not None else None
    out = ft.flex_attention(qf, kf, vf, score_mod=sm, block_mask=mask, enable_gqa=True)
    out.backward(dout)
    q64, k64, v64 = leaves(q.double(), k.double(), v.double())
    ref = dense(q64, k64, v64, score_fn(params64) if score_fn is not None else None,
                mask_fn(params) if mask_fn is not None else None)
    ref.backward(dout.double())
    tol = dict(atol=2e-5, rtol=2e-4)
    torch.testing.assert_close(out.double(), ref, **tol)
    for got, want, name in ((qf.grad, q64.grad, "dq"), (kf.grad, k64.grad, "dk"), (vf.grad, v64.grad, "dv")):
        torch.testing.assert_close(got.double(), want, **tol, msg=lambda m, n=name: f"{n}: {m}")
    for i, (p, p64) in enumerate(zip(params, params64)):
        if p.is_floating_point():
            assert p.grad is not None, f"captured tensor {i} got no gradient"
            torch.testing.assert_close(p.grad.double(), p64.grad, atol=1e-4, rtol=1e-3,
                                       msg=lambda m, i=i: f"d(captured {i}): {m}")
    return out


def test_learned_relative_bias():
    check(lambda p: (lambda s, b, h, q, kv: s + p[0][h, (q - kv + 64).clamp(0, 127)]),
          captured=(torch.randn(4, 128),))


def test_t5_bucketed_bias():
    def t5(p):
        def mod(s, b, h, q, kv):
            d = (q - kv).abs()
            big = 8 + (torch.log(d.float() / 8) / math.log(128 / 8) * 8).long()
            bucket = torch.where(d < 8, d, torch.minimum(big, torch.tensor(15)))
            return s + p[0][h, bucket]
        return mod
    check(t5, captured=(torch.randn(4, 16),), L=150, S=150)


def test_alibi_by_hand_matches_the_builtin():
    slopes = torch.tensor([2.0 ** (-i) for i in range(1, 5)])
    out = check(lambda p: (lambda s, b, h, q, kv: s + slopes[h] * (kv - q)))
    q, k, v = (torch.randn(2, 4, 70, 16, generator=torch.Generator().manual_seed(0)) for _ in range(3))
    mine = ft.flex_attention(q, k, v, score_mod=lambda s, b, h, qi, kv: s + slopes[h] * (kv - qi))
    builtin = ft.flex_attention(q, k, v, score_mod=ft.alibi(slopes))
    torch.testing.assert_close(mine, builtin, atol=1e-6, rtol=1e-5)
    assert out is not None


def test_softcap_by_hand_matches_the_builtin():
    check(lambda p: (lambda s, b, h, q, kv: 30 * torch.tanh(s / 30)))
    q, k, v = (torch.randn(1, 2, 64, 16) * 4 for _ in range(3))
    mine = ft.flex_attention(q, k, v, score_mod=lambda s, b, h, qi, kv: 2.0 * torch.tanh(s / 2.0))
    builtin = ft.flex_attention(q, k, v, score_mod=ft.softcap(2.0))
    torch.testing.assert_close(mine, builtin, atol=1e-6, rtol=1e-5)


def test_attention_sink_and_temperature_get_gradients():
    check(lambda p: (lambda s, b, h, q, kv: torch.where(kv == 0, s + p[0][h], s) * p[1][h]),
          captured=(torch.randn(4), torch.rand(4) + 0.5))


def test_mod_reading_b_and_a_learned_scalar():
    check(lambda p: (lambda s, b, h, q, kv: s * p[0] + (b * 0.5 - h * 0.25)), captured=(torch.tensor(0.75),))


def test_masks_prefix_sliding_document_dilated():
    check(None, lambda p: (lambda b, h, q, kv: (kv < 10) | (kv <= q)))
    check(None, lambda p: (lambda b, h, q, kv: (kv <= q) & (q - kv < 9)))
    doc = torch.tensor([[0] * 30 + [1] * 25 + [2] * 15, [0] * 5 + [1] * 65])
    check(None, lambda p: (lambda b, h, q, kv: (doc[b, q] == doc[b, kv]) & (kv <= q)))
    check(None, lambda p: (lambda b, h, q, kv: ((q - kv) % 3 == 0) & (kv <= q)))
    # a score mod and a mask together, across block sizes that do not divide the length
    check(lambda p: (lambda s, b, h, q, kv: s + p[0][h, (q - kv).clamp(0, 15)]),
          lambda p: (lambda b, h, q, kv: (kv <= q) & (q - kv < 16)), captured=(torch.randn(4, 16),), bm=24)


def test_lengths_change():
    bias = torch.randn(4, 256, requires_grad=True)
    mod = lambda s, b, h, q, kv: s + bias[h, (q - kv + 128).clamp(0, 255)]  # noqa: E731
    for L in (17, 64, 200):
        q, k, v = (torch.randn(1, 4, L, 8) for _ in range(3))
        torch.testing.assert_close(ft.flex_attention(q, k, v, score_mod=mod), dense(q, k, v, mod), atol=2e-5,
                                   rtol=2e-4)


def test_bitwise_across_thread_counts():
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 4, 300, 32, generator=g) for _ in range(3))
    table = torch.randn(4, 64, generator=g)
    results = []
    saved = flexc._state["threads"]
    try:
        for n in (1, 2, 3):
            flexc.set_num_threads(n)
            t = table.clone().requires_grad_(True)
            ql, kl, vl = leaves(q, k, v)
            out = ft.flex_attention(ql, kl, vl, score_mod=lambda s, b, h, qi, kv: s + t[h, (qi - kv).clamp(0, 63)])
            out.square().sum().backward()
            results.append([out, ql.grad, kl.grad, vl.grad, t.grad])
    finally:
        flexc._state["threads"] = saved
    for other in results[1:]:
        for a, b in zip(results[0], other):
            assert torch.equal(a, b)


def test_untraceable_functions_raise_naming_the_operation():
    q, k, v = (torch.randn(1, 2, 16, 8) for _ in range(3))
    bias = torch.randn(2, 16)
    with pytest.raises(TypeError, match="control flow"):
        ft.flex_attention(q, k, v, score_mod=lambda s, b, h, qi, kv: s if s > 0 else -s)
    with pytest.raises(TypeError, match="sin"):
        ft.flex_attention(q, k, v, score_mod=lambda s, b, h, qi, kv: torch.sin(s))
    with pytest.raises(TypeError, match="without indexing"):
        ft.flex_attention(q, k, v, score_mod=lambda s, b, h, qi, kv: s + bias)
    with pytest.raises(TypeError, match="bool"):
        ft.flex_attention(q, k, v, score_mod=lambda s, b, h, qi, kv: qi >= kv)
    with pytest.raises(TypeError, match="float"):
        ft.flex_attention(q, k, v, score_mod=lambda s, b, h, qi, kv: s + bias[h, s])


def test_torch_compile_fullgraph():
    """A module whose attention reads its own learned bias compiles as one graph, gives eager's
    values and gradients, and sees an in-place update of the bias."""
    class Attn(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bias = torch.nn.Parameter(torch.randn(4, 32))

        def forward(self, q, k, v):
            return ft.flex_attention(q, k, v, score_mod=lambda s, b, h, qi, kv: s + self.bias[h, (qi - kv).clamp(0, 31)])

    m = Attn()
    compiled = torch.compile(m, fullgraph=True)
    q, k, v = (torch.randn(1, 4, 40, 8) for _ in range(3))
    for step in range(2):
        outs, grads = [], []
        for fn in (m, compiled):
            m.zero_grad()
            ql = q.clone().requires_grad_(True)
            out = fn(ql, k, v)
            out.square().sum().backward()
            outs.append(out), grads.append((ql.grad, m.bias.grad.clone()))
        assert torch.equal(outs[0], outs[1])
        assert torch.equal(grads[0][0], grads[1][0]) and torch.equal(grads[0][1], grads[1][1])
        with torch.no_grad():
            m.bias.mul_(2.0)  # the next step must read the new values
        if step == 0:
            first = outs[1]
    assert not torch.equal(first, outs[1])
