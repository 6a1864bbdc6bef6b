"""Interpreter exit with live masks: a PyTorch-built BlockMask passed to flex_attention leaves a
flexc BlockMask alive until the end; freeing it at exit must not print "Exception ignored"
(a finalizer that reaches module globals torn down to None)."""
import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.nn.attention.flex_attention")

SCRIPT = textwrap.dedent("""
    import torch
    from torch.nn.attention.flex_attention import create_block_mask

    import flexc.torch as ft

    def causal(b, h, q, kv):
        return q >= kv

    L = 256
    mask = create_block_mask(causal, 1, 1, L, L, device="cpu")
    q, k, v = (torch.randn(1, 2, L, 16) for _ in range(3))
    out = ft.flex_attention(q, k, v, block_mask=mask)
    own = ft.create_block_mask(causal, 1, 1, L, L)
    out2 = ft.flex_attention(q, k, v, block_mask=own)
    assert out.shape == (1, 2, L, 16) and torch.allclose(out, out2, atol=1e-5)
    print("ran")
""")


def test_exit_with_live_block_masks_is_quiet():
    env = dict(os.environ)
    if not env.get("FLEXC_TEST_INSTALLED"):
        pkg = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg, env.get("PYTHONPATH")) if p)
    r = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"exit {r.returncode}; stderr:\n{r.stderr}"
    assert "ran" in r.stdout, r.stdout
    assert "Exception ignored" not in r.stderr, r.stderr
