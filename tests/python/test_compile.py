"""A small nanoGPT-style model trained a few steps with flexc's ops under torch.compile gives
the losses of the same model on SDPA with a dense mask + F.cross_entropy (eager), and compiles
as one graph."""
import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

import flexc.torch as ft

VOCAB, T, C, HEADS, KV_HEADS, LAYERS, BATCH = 97, 64, 32, 4, 2, 2, 2
WINDOW = 24


class Block(nn.Module):
    def __init__(self, use_flexc):
        super().__init__()
        self.use_flexc = use_flexc
        self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.q = nn.Linear(C, C)
        self.kv = nn.Linear(C, 2 * C * KV_HEADS // HEADS)
        self.proj = nn.Linear(C, C)
        self.mlp = nn.Sequential(nn.Linear(C, 4 * C), nn.GELU(), nn.Linear(4 * C, C))

    def forward(self, x, mask, dense_mask):
        B, L, _ = x.shape
        hd = C // HEADS
        y = self.ln1(x)
        q = self.q(y).view(B, L, HEADS, hd).transpose(1, 2)
        k, v = self.kv(y).view(B, L, 2, KV_HEADS, hd).permute(2, 0, 3, 1, 4)
        if self.use_flexc:
            a = ft.flex_attention(q, k, v, block_mask=mask, enable_gqa=True)
        else:
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=dense_mask, enable_gqa=True)
        x = x + self.proj(a.transpose(1, 2).reshape(B, L, C))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, use_flexc):
        super().__init__()
        self.use_flexc = use_flexc
        self.tok = nn.Embedding(VOCAB, C)
        self.pos = nn.Embedding(T, C)
        self.blocks = nn.ModuleList(Block(use_flexc) for _ in range(LAYERS))
        self.ln = nn.LayerNorm(C)
        self.head = nn.Linear(C, VOCAB, bias=False)

    def forward(self, idx, targets, mask=None, dense_mask=None):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        for blk in self.blocks:
            x = blk(x, mask, dense_mask)
        x = self.ln(x).reshape(-1, C)
        if self.use_flexc:
            return ft.linear_cross_entropy(x, self.head.weight, targets.reshape(-1))
        return F.cross_entropy(self.head(x), targets.reshape(-1))


def train(model, step_fn, data, steps=4):
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for s in range(steps):
        idx, tgt = data[s]
        opt.zero_grad(set_to_none=True)
        loss = step_fn(idx, tgt)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_compiled_flexc_model_matches_sdpa():
    torch.manual_seed(0)
    ref = GPT(use_flexc=False)
    ours = GPT(use_flexc=True)
    ours.load_state_dict(copy.deepcopy(ref.state_dict()))
    data = [(torch.randint(0, VOCAB, (BATCH, T)), torch.randint(0, VOCAB, (BATCH, T))) for _ in range(4)]
    mod = ft.and_masks(ft.causal_mask, ft.sliding_window_mask(WINDOW))
    mask = ft.create_block_mask(mod, None, None, T, T, BLOCK_SIZE=16)
    i = torch.arange(T)
    dense = (i[:, None] >= i[None, :]) & (i[:, None] - i[None, :] < WINDOW)

    # fullgraph=True: a graph break is an error. aot_eager: Dynamo and AOTAutograd as with any backend (one graph, the fake kernels, the
    # autograd formulas traced), without Inductor's C++ compile of the whole model (minutes on
    # two cores); test_inductor below runs Inductor on the ops themselves.
    compiled = torch.compile(lambda a, b: ours(a, b, mask), fullgraph=True, backend="aot_eager")
    got = train(ours, compiled, data)
    want = train(ref, lambda a, b: ref(a, b, dense_mask=dense), data)
    for s, (g, w) in enumerate(zip(got, want)):
        assert abs(g - w) <= 1e-4 * abs(w) + 1e-5, f"step {s}: loss {g} vs SDPA + cross_entropy {w} ({got} vs {want})"
    assert got[-1] < got[0]


def test_inductor():
    # The default backend, forward and backward, on attention feeding the fused loss.
    torch.manual_seed(0)
    B, H, L, D = 1, 2, 64, 16
    m = ft.create_block_mask(ft.causal_mask, None, None, L, L, BLOCK_SIZE=32)
    sm = ft.softcap(20.0)

    def f(q, k, v, h, w, t):
        o = ft.flex_attention(q, k, v, block_mask=m, score_mod=sm)
        return ft.linear_cross_entropy(o.reshape(-1, D) + h, w, t)

    inputs = [torch.randn(B, H, L, D, requires_grad=True) for _ in range(3)]
    inputs += [torch.randn(B * H * L, D, requires_grad=True), torch.randn(50, D, requires_grad=True)]
    t = torch.randint(0, 50, (B * H * L,))
    loss = torch.compile(f, fullgraph=True)(*inputs, t)
    grads = torch.autograd.grad(loss, inputs)
    want = f(*inputs, t)
    wgrads = torch.autograd.grad(want, inputs)
    assert torch.equal(loss, want)
    for g, w in zip(grads, wgrads):
        assert torch.equal(g, w)


def test_opcheck():
    # The fake (meta) kernels and autograd registrations agree with the real ops, on
    # non-contiguous inputs too.
    q = torch.randn(1, 4, 40, 8).transpose(1, 2).contiguous().transpose(1, 2)
    k, v = torch.randn(1, 2, 40, 8), torch.randn(1, 2, 40, 8)
    q.requires_grad_()
    mask = ft.create_block_mask(ft.causal_mask, None, None, 40, 40, BLOCK_SIZE=16)
    table = torch.randn(4, 9, requires_grad=True)
    args = (q, k, v, mask._handle, 3, table, 0.0, 4, 0.0, 0)
    # Not test_aot_dispatch_*: they backpropagate through every output, lse included, which
    # these ops refuse (only out, and the loss, are differentiable).
    utils = ("test_schema", "test_autograd_registration", "test_faketensor")
    torch.library.opcheck(torch.ops.flexc.flex_attention.default, args, test_utils=utils)
    h = torch.randn(12, 8).T.contiguous().T.requires_grad_()
    w = torch.randn(30, 8, requires_grad=True)
    t = torch.randint(0, 30, (12,))
    for red, with_grad in ((0, True), (2, False)):
        torch.library.opcheck(torch.ops.flexc.linear_cross_entropy.default,
                              (h, w, None, t, red, -100, 0.0, 0.0, 0.0, 0, with_grad, True), test_utils=utils)
