"""flexc.torch.flex_attention and create_block_mask against PyTorch's eager math on the
materialised mask: forward, lse and every gradient, for each mask, score mod, GQA ratio and
q_offset."""
import itertools

import pytest
import torch
from torch.nn.attention.flex_attention import AuxRequest

import flexc
import flexc.torch as ft
from conftest import assert_close, dense_mask, reference_attention

L = 100  # two and a bit blocks of 48: full, partial and empty blocks, and a ragged last block
BLOCK = 48


def custom_mask(b, h, q, kv):
    """A Python mask_mod with torch ops (per-head, not causal)."""
    return ((q * 7 + kv * 3 + h) % 5 != 0) | (q == kv)


def masks():
    doc1 = torch.arange(L + 20) // 37
    doc2 = torch.stack([torch.arange(L + 20) // 37, (torch.arange(L + 20) // 23) % 3])
    return {
        "none": None,
        "causal": ft.causal_mask,
        "sliding": ft.sliding_window_mask(30),
        "prefix_lm": ft.prefix_lm_mask([20, 61]),
        "document": ft.document_mask(doc1),
        "document_2d": ft.document_mask(doc2),
        "and": ft.and_masks(ft.sliding_window_mask(40), ft.document_mask(doc1)),
        "or": ft.or_masks(ft.prefix_lm_mask(25), ft.sliding_window_mask(10)),
        "custom": custom_mask,
        "and_custom": ft.and_masks(ft.causal_mask, custom_mask),
    }


MASKS = masks()


def score_mods(Hq):
    return {
        "none": None,
        "alibi": ft.alibi(torch.linspace(0.05, 0.5, Hq)),
        "softcap": ft.softcap(2.0),
        "rel_bias_shared": ft.rel_bias(torch.randn(1, 41, requires_grad=True), 20),
        "rel_bias_heads": ft.rel_bias(torch.randn(Hq, 33, requires_grad=True), 16),
    }


def run_case(mask_name, score_name, G, q_offset, B=2, Hkv=2, D=16, Lq=None):
    Hq = Hkv * G
    Lq = L - q_offset if Lq is None else Lq
    mask_mod = MASKS[mask_name]
    score = score_mods(Hq)[score_name]
    mB = B if mask_name in ("document_2d", "prefix_lm") else None
    mH = Hq if mask_name in ("custom", "and_custom") else None
    q = torch.randn(B, Hq, Lq, D, requires_grad=True)
    k = torch.randn(B, Hkv, L, D, requires_grad=True)
    v = torch.randn(B, Hkv, L, D + 8, requires_grad=True)
    bm = ft.create_block_mask(mask_mod, mB, mH, L, L, BLOCK_SIZE=BLOCK) if mask_mod is not None else None
    out, lse = ft.flex_attention(q, k, v, score_mod=score, block_mask=bm, enable_gqa=G > 1, return_lse=True,
                                 q_offset=q_offset)
    dout = torch.randn_like(out)
    table = score._tensor if score_name.startswith("rel_bias") else None
    inputs = [q, k, v] + ([table] if table is not None else [])
    grads = torch.autograd.grad(out, inputs, dout)

    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref_score = None
    t64 = None
    if score is not None:
        if table is not None:
            t64 = table.detach().double().requires_grad_()
            zero, size = score._i, t64.shape[1]

            def ref_score(s, b, h, q, kv):
                hh = h if t64.shape[0] > 1 else torch.zeros_like(h)
                return s + t64[hh, (q - kv + zero).clamp(0, size - 1)]
        else:
            ref_score = score
    r_out, r_lse = reference_attention(q64, k64, v64, mask_mod, ref_score, q_offset=q_offset)
    r_grads = torch.autograd.grad(r_out, [q64, k64, v64] + ([t64] if t64 is not None else []), dout.double())
    what = f"{mask_name}/{score_name}/G={G}/q_offset={q_offset}"
    assert_close(out, r_out, what + " out")
    assert_close(lse, r_lse, what + " lse")
    for name, g, rg in zip(("dq", "dk", "dv", "dtable"), grads, r_grads):
        assert_close(g, rg, f"{what} {name}", atol=5e-5, rtol=5e-4)


@pytest.mark.parametrize("mask_name", list(MASKS))
@pytest.mark.parametrize("score_name", ["none", "alibi", "softcap", "rel_bias_shared", "rel_bias_heads"])
def test_masks_and_score_mods(mask_name, score_name):
    run_case(mask_name, score_name, G=1, q_offset=0)


@pytest.mark.parametrize("mask_name,score_name,G,q_offset", [
    (m, s, G, off) for (m, s), G, off in itertools.product(
        [("none", "none"), ("causal", "alibi"), ("sliding", "rel_bias_heads"), ("document_2d", "softcap"),
         ("custom", "rel_bias_shared"), ("prefix_lm", "none")], [2, 4], [0, 37])])
def test_gqa_and_q_offset(mask_name, score_name, G, q_offset):
    run_case(mask_name, score_name, G, q_offset)


def test_decoding_single_query():
    # One query row at position 99 against a 100-key cache (a decoding step).
    run_case("sliding", "alibi", G=4, q_offset=99, Lq=1, B=1)


def test_scale_and_return_aux():
    q, k, v = (torch.randn(1, 2, 40, 8) for _ in range(3))
    out, aux = ft.flex_attention(q, k, v, scale=0.3, return_aux=AuxRequest(lse=True))
    r_out, r_lse = reference_attention(q.double(), k.double(), v.double(), scale=0.3)
    assert_close(out, r_out, "out")
    assert_close(aux.lse, r_lse, "aux.lse")
    assert aux.max_scores is None
    with pytest.raises(NotImplementedError, match="return_aux"):
        ft.flex_attention(q, k, v, return_aux=AuxRequest(lse=True, max_scores=True))


def test_matches_torch_flex_attention():
    # PyTorch's own flex_attention (eager) on the same mask and score mod.
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    q, k, v = (torch.randn(1, 2, 128, 16) for _ in range(3))
    mod = ft.sliding_window_mask(20)
    tm = create_block_mask(mod, None, None, 128, 128, device="cpu")
    cap = ft.softcap(3.0)
    want, want_lse = flex_attention(q, k, v, score_mod=cap, block_mask=tm, return_lse=True)
    got, got_lse = ft.flex_attention(q, k, v, score_mod=cap, block_mask=ft.create_block_mask(mod, None, None, 128, 128),
                                     return_lse=True)
    assert_close(got, want, "out vs torch")
    assert_close(got_lse, want_lse, "lse vs torch")
    # A PyTorch BlockMask given directly is converted (its blocks, its mask_mod).
    got2 = ft.flex_attention(q, k, v, score_mod=cap, block_mask=tm)
    assert torch.equal(got2, got)


def test_from_torch_block_mask():
    from torch.nn.attention.flex_attention import create_block_mask
    L2 = 200
    tm = create_block_mask(custom_mask, 1, 2, L2, L2, device="cpu", BLOCK_SIZE=64)
    fm = ft.from_torch_block_mask(tm)
    assert fm.shape == (1, 2, L2, L2) and fm.BLOCK_SIZE == (64, 64)
    q, k, v = (torch.randn(1, 2, L2, 16) for _ in range(3))
    r_out, _ = reference_attention(q.double(), k.double(), v.double(), custom_mask)
    assert_close(ft.flex_attention(q, k, v, block_mask=fm), r_out, "converted mask")


def test_analytic_masks_are_sparse():
    m = ft.create_block_mask(ft.sliding_window_mask(256), None, None, 32768, 32768)
    # Window 256 with 128-blocks: at most 3 blocks per row.
    assert m.density() < 3.0 / 256 + 1e-9
    assert m.nbytes() < 4 << 20


def test_custom_mask_traced_once_or_evaluated_by_block_rows():
    seen = []

    def mod(b, h, q, kv):
        seen.append((q.shape, kv.shape))
        return q >= kv

    Lbig = 4096
    ref = ft.create_block_mask(ft.causal_mask, None, None, Lbig, Lbig, BLOCK_SIZE=128)
    # Traced into a mask expression: called once, on 0-d stand-ins; the C library builds it.
    m = ft.create_block_mask(mod, None, None, Lbig, Lbig, BLOCK_SIZE=128)
    assert seen == [(torch.Size([]), torch.Size([]))]
    assert m.density() == ref.density() and m.nbytes() == ref.nbytes()

    # A function outside the language (Python's math on a value) is evaluated a block row at a
    # time instead, with a warning naming why.
    seen.clear()

    def untraceable(b, h, q, kv):
        seen.append((q.shape, kv.shape))
        return torch.cos(q * 0.0) * q >= kv

    with pytest.warns(UserWarning, match="cos"):
        m2 = ft.create_block_mask(untraceable, None, None, Lbig, Lbig, BLOCK_SIZE=128)
    assert len(seen) == 1 + Lbig // 128  # the trace, then the block rows
    assert all(qs[0] <= 128 and ks[-1] == Lbig for qs, ks in seen[1:]), seen[1:3]
    assert m2.density() == ref.density() and m2.nbytes() == ref.nbytes()


def test_fully_masked_rows():
    q, k, v = (torch.randn(1, 1, 64, 8, requires_grad=True) for _ in range(3))
    m = ft.create_block_mask(lambda b, h, q, kv: (q >= 20) & (kv <= q), None, None, 64, 64, BLOCK_SIZE=16)
    out, lse = ft.flex_attention(q, k, v, block_mask=m, return_lse=True)
    assert torch.equal(out[0, 0, :20], torch.zeros(20, 8))
    assert torch.isneginf(lse[0, 0, :20]).all()
    out.sum().backward()
    for t in (q, k, v):
        assert torch.isfinite(t.grad).all()
    assert torch.equal(q.grad[0, 0, :20], torch.zeros(20, 8))


def test_low_precision_and_noncontiguous():
    q, k, v = (torch.randn(1, 64, 3, 16).transpose(1, 2) for _ in range(3))  # [1, 3, 64, 16], strided
    assert not q.is_contiguous()
    m = ft.create_block_mask(ft.causal_mask, None, None, 64, 64, BLOCK_SIZE=32)
    out = ft.flex_attention(q, k, v, block_mask=m)
    assert torch.equal(out, ft.flex_attention(q.contiguous(), k.contiguous(), v.contiguous(), block_mask=m))
    for dtype in (torch.bfloat16, torch.float16):
        ql, kl, vl = (t.to(dtype).requires_grad_() for t in (q, k, v))
        o = ft.flex_attention(ql, kl, vl, block_mask=m)
        assert o.dtype == dtype
        want = ft.flex_attention(*(t.float() for t in (ql, kl, vl)), block_mask=m).to(dtype)
        assert torch.equal(o, want)
        o.float().sum().backward()
        assert ql.grad.dtype == dtype and kl.grad.dtype == dtype
    with torch.autocast("cpu", dtype=torch.bfloat16):
        o = ft.flex_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), block_mask=m)
    assert o.dtype == torch.bfloat16


def test_bitwise_across_thread_counts():
    q, k, v = (torch.randn(2, 4, 300, 32, requires_grad=True) for _ in range(3))
    table = torch.randn(4, 65, requires_grad=True)
    m = ft.create_block_mask(ft.and_masks(ft.causal_mask, custom_mask), 2, 4, 300, 300, BLOCK_SIZE=64)
    results = []
    saved = flexc._state["threads"]
    try:
        for n in (1, 2, 3):
            flexc.set_num_threads(n)
            assert flexc.get_num_threads() == n
            out = ft.flex_attention(q, k, v, block_mask=m, score_mod=ft.rel_bias(table, 32))
            grads = torch.autograd.grad(out, (q, k, v, table), torch.ones_like(out))
            results.append((out,) + grads)
    finally:
        flexc._state["threads"] = saved
    for n, r in zip((2, 3), results[1:]):
        for name, a, b in zip(("out", "dq", "dk", "dv", "dtable"), results[0], r):
            assert torch.equal(a, b), f"{name} differs between 1 and {n} threads"


def test_lse_only_when_needed():
    # Without a gradient in view and no lse asked for, the op skips the lse (returns it
    # empty); the output is bitwise the one computed with it, and return_lse still gets it.
    torch.manual_seed(3)
    q, k, v = (torch.randn(1, 2, 70, 8) for _ in range(3))
    mask = ft.create_block_mask(ft.sliding_window_mask(20), None, None, 70, 70, BLOCK_SIZE=16)
    op = torch.ops.flexc.flex_attention.default
    out_n, lse_n = op(q, k, v, mask._handle, 0, None, 0.0, 0, 0.0, 0, False)
    out_y, lse_y = op(q, k, v, mask._handle, 0, None, 0.0, 0, 0.0, 0, True)
    assert lse_n.numel() == 0 and lse_y.shape == (1, 2, 70)
    assert torch.equal(out_n, out_y)
    with torch.no_grad():
        out, lse = ft.flex_attention(q, k, v, block_mask=mask, return_lse=True)
        assert torch.equal(out, out_y) and torch.equal(lse, lse_y)
    # A tensor needing a gradient keeps the lse for the backward.
    qg = q.clone().requires_grad_()
    out_g = ft.flex_attention(qg, k, v, block_mask=mask)
    assert torch.equal(out_g.detach(), out_y)
    out_g.sum().backward()
    assert qg.grad is not None and torch.isfinite(qg.grad).all()


def test_lse_gradient_refused():
    q, k, v = (torch.randn(1, 1, 16, 8, requires_grad=True) for _ in range(3))
    out, lse = ft.flex_attention(q, k, v, return_lse=True)
    with pytest.raises(NotImplementedError, match="lse"):
        (out.sum() + lse.sum()).backward()


def test_builtins_work_with_torch_create_block_mask():
    # flexc's mask mods are ordinary torch mask_mods too.
    from torch.nn.attention.flex_attention import create_block_mask
    mod = ft.and_masks(ft.sliding_window_mask(16), ft.document_mask(torch.arange(96) // 40))
    tm = create_block_mask(mod, None, None, 96, 96, device="cpu", BLOCK_SIZE=32)
    want = dense_mask(mod, 1, 1, torch.arange(96), 96)[0, 0]
    # The blocks PyTorch visits are exactly those with a visible position.
    visited = want.view(3, 32, 3, 32).any(3).any(1)
    assert torch.equal(tm.to_dense()[0, 0].bool(), visited), (tm.to_dense(), visited)
