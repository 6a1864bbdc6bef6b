"""flexc's OpenMP runtime and PyTorch's in one process: both import orders, several thread
counts, each library keeping its own thread setting, and flexc's results bitwise the same in
every configuration."""
import json
import os
import subprocess
import sys

import pytest

CHILD = r"""
import hashlib, json, sys
order, torch_threads, flexc_threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
if order == "torch-first":
    import torch
    import flexc, flexc.torch as ft
else:
    import flexc, flexc.torch as ft
    import torch
torch.set_num_threads(torch_threads)
flexc.set_num_threads(flexc_threads)
g = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(2, 4, 200, 32, generator=g, requires_grad=True) for _ in range(3))
a = torch.randn(256, 256, generator=g)
digest = hashlib.sha256()
for step in range(2):
    # PyTorch's parallel work before, between and after flexc's.
    mm = a @ a
    err = (mm.double() - a.double() @ a.double()).abs().max().item()
    assert err < 1e-2, err
    m = ft.create_block_mask(ft.sliding_window_mask(70), None, None, 200, 200, BLOCK_SIZE=64)
    out = ft.flex_attention(q, k, v, block_mask=m, score_mod=ft.softcap(5.0))
    out.sum().backward()
    assert torch.get_num_threads() == torch_threads, torch.get_num_threads()
    assert flexc.get_num_threads() == flexc_threads
    s = torch.nn.functional.softmax(a, -1).sum().item()
    for t in (out, q.grad, k.grad, v.grad):
        digest.update(t.detach().numpy().tobytes())
    q.grad = k.grad = v.grad = None
print(json.dumps({"digest": digest.hexdigest(), "torch_threads": torch.get_num_threads()}))
"""


def run(order, torch_threads, flexc_threads):
    env = dict(os.environ)
    env.pop("OMP_NUM_THREADS", None)
    if not env.get("FLEXC_TEST_INSTALLED"):  # the package under test, as in conftest.py
        tree = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python")
        env["PYTHONPATH"] = os.pathsep.join([tree] + [p for p in [env.get("PYTHONPATH")] if p])
    if env.get("FLEXC_LIBRARY"):
        env["FLEXC_LIBRARY"] = os.path.abspath(env["FLEXC_LIBRARY"])
    r = subprocess.run([sys.executable, "-c", CHILD, order, str(torch_threads), str(flexc_threads)], env=env,
                       capture_output=True, text=True, timeout=300, cwd=os.path.dirname(__file__))
    assert r.returncode == 0, f"{order} torch={torch_threads} flexc={flexc_threads}: exit {r.returncode}\n{r.stderr}"
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_runtimes_coexist():
    configs = [("torch-first", 1, 1), ("torch-first", 2, 3), ("flexc-first", 3, 1), ("flexc-first", 1, 2)]
    digests = {}
    for c in configs:
        digests[c] = run(*c)["digest"]
    assert len(set(digests.values())) == 1, f"flexc's results differ between configurations: {digests}"


def test_set_num_threads_checks():
    import flexc
    with pytest.raises(ValueError, match="n = 0"):
        flexc.set_num_threads(0)
    with pytest.raises(TypeError):
        flexc.set_num_threads(2.0)
