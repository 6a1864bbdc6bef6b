"""The memory of flexc.torch.linear_cross_entropy: one step (forward and backward, from .grad
None) allocates its outputs (loss, input.grad, weight.grad) and the C kernel's chunk scratch,
and nothing else: no [N, V] logits, no second [V, D] gradient, no float32 copy of float32
inputs, and the gradients autograd stores are the ones the forward computed, unchanged."""
import ctypes
import json
import os
import subprocess
import sys

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

import flexc.torch as ft
from flexc import _lib
from torch.nn import LinearCrossEntropyOptions


def allocations(fn):
    """Sizes in bytes of the tensor allocations made while fn runs (the profiler's per-op
    allocation records, which include the ops run inside custom ops and by autograd)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    return sorted((e.self_cpu_memory_usage for e in prof.events() if e.self_cpu_memory_usage > 0), reverse=True)


def direct(h, w, t, reduction=0):
    """loss, dh, dw from the C call itself, for comparison."""
    N, D = h.shape
    V = w.shape[0]
    loss, dh, dw = torch.zeros(()), torch.empty(N, D), torch.zeros(V, D)
    p = _lib.Lce(N, D, V, -100, reduction, 0.0, 0.0, 0.0, 0, 0)
    ptr = lambda x: ctypes.c_void_p(x.data_ptr())  # noqa: E731
    _lib.check(_lib.fx_linear_cross_entropy(ctypes.byref(p), ptr(h), ptr(w), None, ptr(t), ptr(loss), None, ptr(dh),
                                            ptr(dw), None), "linear_cross_entropy")
    return loss, dh, dw


# Sizes chosen so that [N, D], [V, D] and [N, V] differ from each other and from every small
# allocation.
N, D, V = 96, 40, 1000


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_one_step_allocates_its_outputs_only(reduction):
    h = torch.randn(N, D, requires_grad=True)
    w = (torch.randn(V, D) * 0.2).requires_grad_()
    t = torch.randint(0, V, (N,))
    ft.linear_cross_entropy(h, w, t, reduction=reduction).sum().backward()  # warm-up
    h.grad = w.grad = None

    def step():
        ft.linear_cross_entropy(h, w, t, reduction=reduction).sum().backward()

    sizes = allocations(step)
    nd, vd, nv = 4 * N * D, 4 * V * D, 4 * N * V
    assert not [s for s in sizes if s >= nv], f"{reduction}: an allocation of [N, V] logits or more: {sizes[:4]}"
    assert sizes.count(vd) == 1 and not [s for s in sizes if s > nd and s != vd], \
        f"{reduction}: want one [V, D] ({vd} B) allocation and nothing between [N, D] and it, got {sizes[:6]}"
    assert sizes.count(nd) == 1, f"{reduction}: want one [N, D] ({nd} B) allocation, got {sizes[:6]}"
    # Nothing else of any size: the loss, lse and a few scalars.
    assert sum(sizes) - nd - vd <= 16 * N, f"{reduction}: {sum(sizes) - nd - vd} B beyond the gradients: {sizes}"


def test_gradients_are_the_forwards_unchanged():
    h = torch.randn(N, D, requires_grad=True)
    w = (torch.randn(V, D) * 0.2).requires_grad_()
    t = torch.randint(0, V, (N,))
    loss = ft.linear_cross_entropy(h, w, t)
    loss.backward()
    want_loss, want_dh, want_dw = direct(h.detach(), w.detach(), t)
    assert torch.equal(loss.detach(), want_loss)
    for name, got, want in (("input.grad", h.grad, want_dh), ("weight.grad", w.grad, want_dw)):
        diff = (got - want).abs()
        assert torch.equal(got, want), f"{name}: largest error {diff.max().item():.3g} at {int(diff.argmax())}"
    # With an upstream gradient of 3, exactly 3 times as much (scaled in place, once).
    h.grad = w.grad = None
    (3.0 * ft.linear_cross_entropy(h, w, t)).backward()
    assert torch.equal(h.grad, 3.0 * want_dh) and torch.equal(w.grad, 3.0 * want_dw)


def test_retain_graph_allocates_one_more_gradient():
    # allow_retain_graph keeps the forward's gradients for a second backward: the backward's
    # scaled copies are the one extra [N, D] and [V, D] that PyTorch's option documents.
    h = torch.randn(N, D, requires_grad=True)
    w = (torch.randn(V, D) * 0.2).requires_grad_()
    t = torch.randint(0, V, (N,))
    opts = LinearCrossEntropyOptions(allow_retain_graph=True)
    ft.linear_cross_entropy(h, w, t, options=opts).backward()
    h.grad = w.grad = None
    sizes = allocations(lambda: ft.linear_cross_entropy(h, w, t, options=opts).backward())
    assert sizes.count(4 * V * D) == 2 and sizes.count(4 * N * D) == 2, f"got {sizes[:6]}"


_CHILD = r"""
import json, sys, torch
import flexc.torch as ft
N, D, V, red = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
def rss(field):
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith(field + ":"))
torch.set_num_threads(2)
g = torch.Generator().manual_seed(0)
hs, ws = torch.randn(16, D, generator=g, requires_grad=True), torch.randn(256, D, generator=g, requires_grad=True)
ft.linear_cross_entropy(hs, ws, torch.zeros(16, dtype=torch.int64), reduction=red).sum().backward()  # warm-up, small
h = torch.randn(N, D, generator=g).requires_grad_()
w = (torch.randn(V, D, generator=g) * 0.1).requires_grad_()
t = torch.randint(0, V, (N,), generator=g)
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
start = rss("VmRSS")
ft.linear_cross_entropy(h, w, t, reduction=red).sum().backward()
print(json.dumps({"growth": rss("VmHWM") - start, "outputs": h.grad.nbytes + w.grad.nbytes}))
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux's resident-peak reset")
def test_resident_peak_beyond_the_outputs(reduction="mean"):
    # The whole step in a fresh process, the C kernel's scratch included: the resident peak
    # grows by the gradients plus the scratch (at most 2 MiB), far below one more
    # [V, D] buffer (32 MiB) or the [N, V] logits (64 MiB).
    Nn, Dn, Vn = 256, 128, 65536
    env = dict(os.environ, OMP_NUM_THREADS="2",
               PYTHONPATH=os.pathsep.join([os.path.join(os.path.dirname(__file__), "..", "..", "python")] +
                                          [p for p in [os.environ.get("PYTHONPATH")] if p]))
    r = subprocess.run([sys.executable, "-c", _CHILD, str(Nn), str(Dn), str(Vn), reduction], env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    extra = got["growth"] - got["outputs"]
    bound = 4 * Vn * Dn // 4
    assert extra <= bound, (f"{reduction}: the step's resident peak grew {extra} B beyond its outputs "
                            f"({got['outputs']} B); bound {bound} B (a [V, D] buffer is {4 * Vn * Dn} B)")
