"""flexc.torch.linear_cross_entropy and LinearCrossEntropyLoss against F.cross_entropy on
materialised logits: every reduction, ignore_index, label_smoothing, bias, z_loss, softcap, and
the gradients of input, weight and bias."""
import itertools

import pytest
import torch
import torch.nn.functional as F

import flexc
import flexc.torch as ft
from conftest import assert_close

N, D, V = 70, 24, 130


def inputs(bias=False, ignore=None):
    h = torch.randn(N, D, requires_grad=True)
    w = (torch.randn(V, D) * 0.3).requires_grad_()
    b = torch.randn(V, requires_grad=True) if bias else None
    t = torch.randint(0, V, (N,))
    if ignore is not None:
        t[::4] = ignore
    return h, w, b, t


def reference(h, w, b, t, z_loss=0.0, softcap=0.0, **kw):
    logits = h.double() @ w.double().T + (b.double() if b is not None else 0)
    if softcap:
        logits = softcap * torch.tanh(logits / softcap)
    loss = F.cross_entropy(logits, t, **kw)
    if z_loss:
        ignore = kw.get("ignore_index", -100)
        keep = (t != ignore).double()
        zl = z_loss * torch.logsumexp(logits, -1) ** 2 * keep
        red = kw.get("reduction", "mean")
        loss = loss + (zl if red == "none" else zl.sum() / (keep.sum() if red == "mean" else 1))
    return loss


@pytest.mark.parametrize("reduction,ignore,smoothing,bias", list(itertools.product(
    ["mean", "sum", "none"], [None, 7], [0.0, 0.15], [False, True])))
def test_against_cross_entropy(reduction, ignore, smoothing, bias):
    h, w, b, t = inputs(bias, ignore)
    kw = dict(reduction=reduction, label_smoothing=smoothing)
    if ignore is not None:
        kw["ignore_index"] = ignore
    loss = ft.linear_cross_entropy(h, w, t, linear_bias=b, **kw)
    params = [h, w] + ([b] if bias else [])
    h64, w64 = h.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    b64 = b.detach().double().requires_grad_() if bias else None
    want = reference(h64, w64, b64, t, **kw)
    what = f"{reduction}/ignore={ignore}/eps={smoothing}/bias={bias}"
    assert_close(loss, want, what + " loss")
    up = torch.randn_like(want) if reduction == "none" else torch.tensor(1.7, dtype=torch.float64)
    grads = torch.autograd.grad(loss, params, up.float())
    wgrads = torch.autograd.grad(want, [h64, w64] + ([b64] if bias else []), up)
    for name, g, r in zip(("input", "weight", "bias"), grads, wgrads):
        assert_close(g, r, f"{what} d{name}", atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_z_loss_and_softcap(reduction):
    h, w, b, t = inputs(True, -100)
    loss = ft.linear_cross_entropy(h, w, t, linear_bias=b, reduction=reduction, z_loss=1e-3, softcap=5.0,
                                   label_smoothing=0.1)
    h64, w64, b64 = (x.detach().double().requires_grad_() for x in (h, w, b))
    want = reference(h64, w64, b64, t, z_loss=1e-3, softcap=5.0, reduction=reduction, label_smoothing=0.1)
    assert_close(loss, want, "loss")
    g = torch.autograd.grad(loss.sum(), (h, w, b))
    r = torch.autograd.grad(want.sum(), (h64, w64, b64))
    for name, a, c in zip(("input", "weight", "bias"), g, r):
        assert_close(a, c, "d" + name, atol=1e-5, rtol=1e-4)


def test_single_input_and_all_ignored():
    h, w, _, t = inputs()
    one = ft.linear_cross_entropy(h[3], w, t[3], reduction="none")
    assert one.shape == ()
    assert_close(one, reference(h[3:4], w, None, t[3:4], reduction="none")[0], "[D] input")
    t_all = torch.full((N,), -100)
    loss = ft.linear_cross_entropy(h, w, t_all)
    assert torch.isnan(loss)
    loss.backward()
    assert torch.equal(h.grad, torch.zeros_like(h)) and torch.equal(w.grad, torch.zeros_like(w))


def test_options_and_retain_graph():
    from torch.nn import LinearCrossEntropyOptions
    h, w, _, t = inputs()
    base = ft.linear_cross_entropy(h, w, t)
    chunked = ft.linear_cross_entropy(h, w, t, options=LinearCrossEntropyOptions(batch_chunk_size=16))
    assert_close(chunked, base, "chunked")
    loss = ft.linear_cross_entropy(h, w, t, options=LinearCrossEntropyOptions(allow_retain_graph=True))
    loss.backward(retain_graph=True)
    g1 = h.grad.clone()
    loss.backward()
    assert_close(h.grad, 2 * g1, "second backward")
    # Without allow_retain_graph the gradients are scaled in place: a second backward fails.
    loss = ft.linear_cross_entropy(h, w, t)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError):
        loss.backward()
    with pytest.raises(NotImplementedError, match="acc_dtype"):
        ft.linear_cross_entropy(h, w, t, options=LinearCrossEntropyOptions(acc_dtype=torch.float16))


def test_low_precision():
    h, w, _, t = inputs()
    for dtype in (torch.bfloat16, torch.float16):
        hl, wl = h.detach().to(dtype).requires_grad_(), w.detach().to(dtype).requires_grad_()
        loss = ft.linear_cross_entropy(hl, wl, t)
        assert loss.dtype == dtype
        assert loss.float() == ft.linear_cross_entropy(hl.float(), wl.float(), t).to(dtype).float()
        loss.backward()
        assert hl.grad.dtype == dtype and wl.grad.dtype == dtype


def test_noncontiguous():
    h, w, _, t = inputs()
    hT = h.detach().T.contiguous().T  # same values, column-major
    assert not hT.is_contiguous()
    assert torch.equal(ft.linear_cross_entropy(hT, w, t), ft.linear_cross_entropy(h, w, t))


def test_module_matches_pytorch():
    torch.manual_seed(1)
    ours = ft.LinearCrossEntropyLoss(D, V, bias=True, reduction="sum", label_smoothing=0.05, ignore_index=3)
    theirs = torch.nn.LinearCrossEntropyLoss(D, V, bias=True, reduction="sum", label_smoothing=0.05, ignore_index=3)
    theirs.load_state_dict(ours.state_dict())
    h, _, _, t = inputs(ignore=3)
    a = ours(h, t)
    b = theirs(h, t)
    assert_close(a, b, "module loss", atol=1e-4, rtol=1e-5)
    a.backward()
    b.backward()
    assert_close(ours.linear.weight.grad, theirs.linear.weight.grad, "module dW", atol=1e-5, rtol=1e-4)
    assert_close(ours.linear.bias.grad, theirs.linear.bias.grad, "module dbias", atol=1e-5, rtol=1e-4)
    with pytest.raises(NotImplementedError, match="out_features"):
        ft.LinearCrossEntropyLoss(D, V, out_features=(2,))
    with pytest.raises(NotImplementedError, match="weight"):
        ft.LinearCrossEntropyLoss(D, V, weight=torch.ones(V))


def check_bitwise_across_thread_counts(N, D, V):
    h = torch.randn(N, D, requires_grad=True)
    w = torch.randn(V, D, requires_grad=True)
    b = torch.randn(V, requires_grad=True)
    t = torch.randint(0, V, (N,))
    results = []
    saved = flexc._state["threads"]
    try:
        for n in (1, 2, 3):
            flexc.set_num_threads(n)
            for red in ("mean", "none"):
                loss = ft.linear_cross_entropy(h, w, t, linear_bias=b, reduction=red, label_smoothing=0.1)
                results.append((n, red, loss.detach()) + torch.autograd.grad(loss.sum(), (h, w, b)))
    finally:
        flexc._state["threads"] = saved
    for r in results[2:]:
        base = results[0] if r[1] == "mean" else results[1]
        for name, a, c in zip(("loss", "dinput", "dweight", "dbias"), base[2:], r[2:]):
            assert torch.equal(a, c), f"{name} ({r[1]}) differs between 1 and {r[0]} threads"


def test_bitwise_across_thread_counts():
    check_bitwise_across_thread_counts(400, 400, 500)


def test_bitwise_across_thread_counts_large_vocab():
    check_bitwise_across_thread_counts(600, 64, 3000)


def test_bitwise_across_runs():
    # The same call twice at the same thread count: bitwise equal.
    h, w, b, t = inputs(True, 5)
    a = ft.linear_cross_entropy(h, w, t, linear_bias=b, reduction="none")
    ga = torch.autograd.grad(a.sum(), (h, w, b))
    c = ft.linear_cross_entropy(h, w, t, linear_bias=b, reduction="none")
    gc = torch.autograd.grad(c.sum(), (h, w, b))
    assert torch.equal(a, c) and all(torch.equal(x, y) for x, y in zip(ga, gc))
