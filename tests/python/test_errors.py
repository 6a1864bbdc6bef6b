"""Bad input raises a Python exception that names the argument; nothing crashes."""
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import flexc.torch as ft


def qkv(B=1, H=2, L=32, D=8, dtype=torch.float32):
    return tuple(torch.randn(B, H, L, D, dtype=dtype) for _ in range(3))


def test_attention_shapes_dtypes_devices():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="query must have 4 dimensions"):
        ft.flex_attention(q[0], k, v)
    with pytest.raises(ValueError, match="key's last dimension"):
        ft.flex_attention(q, k[..., :4], v)
    with pytest.raises(ValueError, match="value"):
        ft.flex_attention(q, k, v[:, :, :10])
    with pytest.raises(ValueError, match="batch sizes differ"):
        ft.flex_attention(q, torch.cat([k, k]), torch.cat([v, v]))
    with pytest.raises(ValueError, match="enable_gqa"):
        ft.flex_attention(torch.randn(1, 4, 32, 8), k, v)
    with pytest.raises(ValueError, match="multiple"):
        ft.flex_attention(torch.randn(1, 3, 32, 8), k, v, enable_gqa=True)
    with pytest.raises(TypeError, match="query has dtype float64"):
        ft.flex_attention(q.double(), k.double(), v.double())
    with pytest.raises(TypeError, match="one dtype"):
        ft.flex_attention(q, k.half(), v)
    with pytest.raises(ValueError, match="key is on meta"):
        ft.flex_attention(q, k.to("meta"), v)
    with pytest.raises(TypeError, match="value must be a torch.Tensor"):
        ft.flex_attention(q, k, v.numpy())
    with pytest.raises(ValueError, match="scale"):
        ft.flex_attention(q, k, v, scale=float("nan"))
    with pytest.raises(ValueError, match="q_offset"):
        ft.flex_attention(q, k, v, q_offset=-1)
    with pytest.raises(NotImplementedError, match="kernel_options"):
        ft.flex_attention(q, k, v, kernel_options={"BLOCK_M": 64})
    with pytest.raises(TypeError, match="score_mod must be callable"):
        ft.flex_attention(q, k, v, score_mod=2.0)


def test_attention_mask_and_score_mod_mismatch():
    q, k, v = qkv()
    small = ft.create_block_mask(ft.causal_mask, None, None, 16, 16)
    with pytest.raises(ValueError, match="block_mask covers 16 x 16"):
        ft.flex_attention(q, k, v, block_mask=small)
    m = ft.create_block_mask(ft.causal_mask, None, None, 32, 32)
    with pytest.raises(ValueError, match="block_mask covers"):
        ft.flex_attention(q, k, v, block_mask=m, q_offset=1)
    per_head = ft.create_block_mask(ft.causal_mask, None, 3, 32, 32)
    with pytest.raises(ValueError, match="H = 3"):
        ft.flex_attention(q, k, v, block_mask=per_head)
    with pytest.raises(TypeError, match="block_mask"):
        ft.flex_attention(q, k, v, block_mask="causal")
    with pytest.raises(ValueError, match="alibi: slopes has 3"):
        ft.flex_attention(q, k, v, score_mod=ft.alibi(torch.ones(3)))
    with pytest.raises(ValueError, match="rel_bias: table has 3 heads"):
        ft.flex_attention(q, k, v, score_mod=ft.rel_bias(torch.ones(3, 5), 2))
    with pytest.raises(ValueError, match="softcap"):
        ft.softcap(0.0)
    with pytest.raises(ValueError, match="window"):
        ft.sliding_window_mask(0)


def test_create_block_mask_errors():
    with pytest.raises(ValueError, match="Q_LEN"):
        ft.create_block_mask(ft.causal_mask, None, None, 0, 8)
    with pytest.raises(ValueError, match="BLOCK_SIZE"):
        ft.create_block_mask(ft.causal_mask, None, None, 8, 8, BLOCK_SIZE=5000)
    with pytest.raises(ValueError, match="device"):
        ft.create_block_mask(ft.causal_mask, None, None, 8, 8, device="meta")
    with pytest.raises(NotImplementedError, match="separate_full_blocks"):
        ft.create_block_mask(ft.causal_mask, None, None, 8, 8, separate_full_blocks=False)
    with pytest.raises(TypeError, match="mask_mod must return a bool tensor, got dtype torch.int64"):
        ft.create_block_mask(lambda b, h, q, kv: q - kv, None, None, 40, 40)
    with pytest.raises(ValueError, match=r"mask_mod returned shape \(3,\)"):
        ft.create_block_mask(lambda b, h, q, kv: torch.ones(3, dtype=torch.bool), None, None, 40, 40)
    with pytest.raises(TypeError, match="mask_mod must return a torch.Tensor"):
        ft.create_block_mask(lambda b, h, q, kv: True, None, None, 40, 40)
    with pytest.raises(ZeroDivisionError):  # the mask_mod's own exception, raised again
        ft.create_block_mask(lambda b, h, q, kv: 1 / 0, None, None, 40, 40)
    with pytest.raises(TypeError, match="mask_mod must be callable"):
        ft.create_block_mask(3, None, None, 8, 8)
    with pytest.raises(ValueError, match="document_mask"):
        ft.document_mask(torch.zeros(2, 2, 2, dtype=torch.long))
    with pytest.raises(TypeError, match="integers"):
        ft.prefix_lm_mask([1.5])
    two_rows = ft.document_mask(torch.zeros(2, 32, dtype=torch.long))
    with pytest.raises(ValueError, match="2 batch rows; B = 3"):
        ft.create_block_mask(ft.and_masks(ft.causal_mask, two_rows), 3, None, 32, 32)
    # A document mask shorter than the sequence: the C library's check, as a ValueError.
    with pytest.raises(ValueError, match="len = 10"):
        ft.create_block_mask(ft.document_mask(torch.zeros(10, dtype=torch.long)), None, None, 32, 32)


# The call that grew to 21 GB: run in a child under an address-space limit of 1 GiB above what it
# maps after importing torch, so that a mask allocated after all fails there instead of bringing
# the OOM killer to this machine.
HUGE_BATCH = textwrap.dedent("""
    import resource, time
    import flexc.torch as ft

    with open("/proc/self/status") as f:
        vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    want = vm + (1 << 30)
    if hard == resource.RLIM_INFINITY or hard >= want:
        resource.setrlimit(resource.RLIMIT_AS, (want, hard))
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.monotonic()
    try:
        ft.create_block_mask(ft.causal_mask, 2**31, None, 64, 64)
        print("built")
    except ValueError as e:
        print("ValueError:", e)
    print("seconds", time.monotonic() - t0)
    print("rss_growth_kb", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0)
""")


def test_huge_batch_mask_refused_without_allocating():
    env = dict(os.environ)
    if not env.get("FLEXC_TEST_INSTALLED"):
        pkg = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg, env.get("PYTHONPATH")) if p)
    r = subprocess.run([sys.executable, "-c", HUGE_BATCH], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"exit {r.returncode}; stdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    out = {k: v for k, _, v in (line.partition(" ") for line in r.stdout.splitlines())}
    assert "ValueError:" in out, r.stdout
    msg = out["ValueError:"]
    assert "create_block_mask: block mask of B = 2147483648, H = 1, 1 x 1 blocks of 128 x 128" in msg, msg
    assert "above the limit of 4294967296 bytes" in msg and "flexc.torch.set_block_mask_max_bytes" in msg, msg
    assert float(out["seconds"]) < 2.0, r.stdout
    assert int(out["rss_growth_kb"]) < 64 << 10, r.stdout


def test_block_mask_size_bound():
    assert ft.block_mask_max_bytes() == 4 << 30
    calls = []

    def counted(b, h, q, kv):  # outside the mod language (cos): evaluated by block rows
        calls.append(q.shape)
        return torch.cos(q * 0.0) * q >= kv

    # Every dimension, for a built-in mask and for a Python mask_mod (never called).
    for args, dims in [((2**31, None, 64, 64), "B = 2147483648, H = 1, 1 x 1 blocks"),
                       ((None, 2**31, 64, 64), "B = 1, H = 2147483648, 1 x 1 blocks"),
                       ((None, None, 2**37, 64), "B = 1, H = 1, 1073741824 x 1 blocks"),
                       ((None, None, 64, 2**37), "B = 1, H = 1, 1 x 1073741824 blocks")]:
        with pytest.raises(ValueError, match=rf"{dims} of 128 x 128 .*: its block tables need \d+ bytes"):
            ft.create_block_mask(ft.causal_mask, *args)
        with pytest.raises(ValueError, match="set_block_mask_max_bytes"):
            ft.create_block_mask(counted, *args)
    # The block row a Python mask_mod would be evaluated on.
    with pytest.raises(ValueError, match=r"block rows of 128 x 8589934592 positions, about 8796093022208 bytes each"):
        ft.create_block_mask(counted, None, None, 64, 2**33)
    assert all(shape == torch.Size([]) for shape in calls)  # traced (and refused by it), never evaluated
    with pytest.raises(ValueError, match=r"2\*\*63"):
        ft.create_block_mask(ft.causal_mask, 2**63, None, 64, 64)
    with pytest.raises(ValueError, match="nbytes"):
        ft.set_block_mask_max_bytes(-1)
    # Visit lists and bitmaps, once counted: over a lowered bound, then within it.
    try:
        ft.set_block_mask_max_bytes(200 << 10)
        assert ft.block_mask_max_bytes() == 200 << 10
        with pytest.raises(ValueError, match=r"lists of 32896 visited blocks and the bitmaps of 256 partial ones need "
                                             r"\d+ bytes .*above the limit of 204800 bytes"):
            ft.create_block_mask(ft.causal_mask, None, None, 4096, 4096, BLOCK_SIZE=16)
        ft.set_block_mask_max_bytes(1 << 20)
        with pytest.raises(ValueError, match="a block row and the bitmaps of"):  # every block partial
            ft.create_block_mask(lambda b, h, q, kv: (q + kv) % 2 == 0, None, None, 4096, 4096, BLOCK_SIZE=16)
        m = ft.create_block_mask(ft.causal_mask, None, None, 4096, 4096, BLOCK_SIZE=16)
        assert 0 < m.nbytes() <= 1 << 20
    finally:
        ft.set_block_mask_max_bytes(None)
    assert ft.block_mask_max_bytes() == 4 << 30


def test_lce_errors():
    h, w, t = torch.randn(6, 4), torch.randn(10, 4), torch.randint(0, 10, (6,))
    bad = t.clone()
    bad[2] = 10
    with pytest.raises(IndexError, match=r"target\[2\] = 10"):
        ft.linear_cross_entropy(h, w, bad)
    bad[2] = -5
    with pytest.raises(IndexError, match="target"):
        ft.linear_cross_entropy(h, w, bad)
    with pytest.raises(ValueError, match="linear_weight is"):
        ft.linear_cross_entropy(h, w[:, :3], t)
    with pytest.raises(ValueError, match="target has shape"):
        ft.linear_cross_entropy(h, w, t[:5])
    with pytest.raises(ValueError, match="linear_bias has shape"):
        ft.linear_cross_entropy(h, w, t, linear_bias=torch.zeros(9))
    with pytest.raises(ValueError, match="input must be"):
        ft.linear_cross_entropy(h.view(2, 3, 4), w, t)
    with pytest.raises(TypeError, match="input has dtype float64"):
        ft.linear_cross_entropy(h.double(), w, t)
    with pytest.raises(ValueError, match="linear_weight is on meta"):
        ft.linear_cross_entropy(h, w.to("meta"), t)
    with pytest.raises(NotImplementedError, match="target"):
        ft.linear_cross_entropy(h, w, torch.rand(6, 10))
    with pytest.raises(NotImplementedError, match="weight"):
        ft.linear_cross_entropy(h, w, t, weight=torch.ones(10))
    with pytest.raises(ValueError, match="reduction"):
        ft.linear_cross_entropy(h, w, t, reduction="avg")
    with pytest.raises(ValueError, match="label_smoothing"):
        ft.linear_cross_entropy(h, w, t, label_smoothing=1.5)
    with pytest.raises(ValueError, match="softcap"):
        ft.linear_cross_entropy(h, w, t, softcap=-1.0)
    with pytest.raises(TypeError, match="options"):
        ft.linear_cross_entropy(h, w, t, options={"batch_chunk_size": 2})
