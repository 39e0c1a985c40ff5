"""Member folds (madsl/kernels/member_fold.py): under torch.func.vmap over a stacked model's
members, ops without a vmap rule run once with the member axis folded into an axis they
treat independently. Each fold equals a loop over the members, forward and backward
(float64), and every layer that declares `stacks` is exact under vmap; the stacked trainer's
parity with unbatched runs is tests/test_grid.py's."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

from madsl.kernels import member_fold
from madsl.kernels.attention import scaled_dot_product_attention
from madsl.kernels.causal_conv1d import causal_conv1d_silu
from madsl.kernels.gla import gla_chunked
from madsl.kernels.linear_recurrence import decay_parallel, delta_parallel
from madsl.kernels.selective_scan import selective_scan
from madsl.kernels.selective_scan_chunked import selective_scan_chunked
from madsl.kernels.selective_scan_cpu import selective_scan_cpu
from madsl.kernels.selective_scan_reference import selective_scan_reference
from madsl.lang.stdlib import primitive, primitives
from madsl.runner.batched.stacked import batchable

MEMBERS = 3
f64 = torch.float64


def _leaves(*shapes, generator):
    return [torch.randn(*s, dtype=f64, generator=generator).requires_grad_() for s in shapes]


def _vmap_equals_loop(fn, args, in_dims=0, atol=1e-12):
    """vmap(fn) over the leading member axis against stacking fn per member: outputs and the
    gradients of every input (by ordinary autograd after the vmap, as the stacked trainer does).
    No warning: a vmap fallback loop ("performance drop") would mean the fold did not apply."""
    dims = in_dims if isinstance(in_dims, tuple) else (in_dims,) * len(args)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = torch.func.vmap(fn, in_dims=dims)(*args)
    loop = [fn(*(a[m] if d == 0 else a for a, d in zip(args, dims))) for m in range(MEMBERS)]
    got = got if isinstance(got, tuple) else (got,)
    want = tuple(torch.stack(o) for o in zip(*loop)) if isinstance(loop[0], tuple) else (torch.stack(loop),)
    weights = [torch.randn_like(w) for w in want]
    leaves = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    grads = torch.autograd.grad(sum((g * w).sum() for g, w in zip(got, weights) if g.requires_grad), leaves)
    grads_want = torch.autograd.grad(sum((g * w).sum() for g, w in zip(want, weights) if g.requires_grad), leaves)
    for g, w in zip(got + grads, want + grads_want):
        torch.testing.assert_close(g, w, atol=atol, rtol=1e-10)


@pytest.mark.parametrize("window", [None, 3])
def test_sdpa_folds_members_into_the_batch(window):
    gen = torch.Generator().manual_seed(0)
    q, k, v = _leaves(*[(MEMBERS, 2, 3, 7, 4)] * 3, generator=gen)
    back = torch.arange(7)[:, None] - torch.arange(7)[None, :]
    band = (back >= 0) & (back < 3)
    fn = (
        (lambda q, k, v: scaled_dot_product_attention(q, k, v, is_causal=True))
        if window is None
        else (lambda q, k, v: scaled_dot_product_attention(q, k, v, attn_mask=band))
    )
    _vmap_equals_loop(fn, [q, k, v])


def _scan_args(gen, batch=2, d_inner=6, d_state=3, length=9, groups=None, members=None):
    lead = () if members is None else (members,)
    B_shape = (batch, d_state, length) if groups is None else (batch, groups, d_state, length)
    u, delta, z = _leaves(*[lead + (batch, d_inner, length)] * 3, generator=gen)
    B, C = _leaves(lead + B_shape, lead + B_shape, generator=gen)
    A = (-torch.rand(*lead, d_inner, d_state, dtype=f64, generator=gen) - 0.5).requires_grad_()
    D, bias = _leaves(lead + (d_inner,), lead + (d_inner,), generator=gen)
    return [u, delta, A, B, C, D, z, bias]


@pytest.mark.parametrize("scan", [selective_scan_cpu, selective_scan_chunked])
def test_grouped_B_C_scans_equal_the_reference(scan):
    """B, C (batch, groups, d_state, L): channel d reads group d // (d_inner / groups), as mamba-ssm."""
    args = _scan_args(torch.Generator().manual_seed(1), d_inner=6, groups=3)
    out, last = scan(*args, delta_softplus=True, return_last_state=True)
    ref, ref_last = selective_scan_reference(*args, delta_softplus=True, return_last_state=True)
    torch.testing.assert_close(last, ref_last)
    w = torch.randn_like(out)
    for g, r in zip(torch.autograd.grad((out * w).sum(), args), torch.autograd.grad((ref * w).sum(), args)):
        torch.testing.assert_close(g, r)
    with pytest.raises(ValueError, match="do not split into the 4 groups"):
        selective_scan_cpu(*_scan_args(torch.Generator().manual_seed(1), d_inner=6, groups=4))


@pytest.mark.parametrize("last_state", [False, True])
def test_the_scan_folds_members_into_channels(last_state):
    """Per-member u, delta, z, A, D, bias and B, C: one scan over members x channels."""
    args = _scan_args(torch.Generator().manual_seed(2), members=MEMBERS)
    _vmap_equals_loop(lambda *a: selective_scan(*a, delta_softplus=True, return_last_state=last_state), args)


def test_the_scan_folds_shared_parameters():
    """A, D and the bias the same for every member (not vmapped): expanded along the channels."""
    args = _scan_args(torch.Generator().manual_seed(3), members=MEMBERS)
    for i in (2, 5, 7):
        args[i] = args[i][0].detach().requires_grad_()
    _vmap_equals_loop(
        lambda *a: selective_scan(*a, delta_softplus=True), args, in_dims=(0, 0, None, 0, 0, None, 0, None)
    )


class _StandInConv(torch.autograd.Function):
    """causal-conv1d's causal_conv1d_fn as the library has it: an autograd.Function without a
    vmap rule (so vmap would fail without the fold)."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight, bias)
        return _StandInConv.compute(x, weight, bias).detach()

    @staticmethod
    def compute(x, weight, bias):
        out = F.conv1d(F.pad(x, (weight.shape[1] - 1, 0)), weight.unsqueeze(1), bias, groups=weight.shape[0])
        return F.silu(out)

    @staticmethod
    def backward(ctx, grad):
        x, weight, bias = ctx.saved_tensors
        with torch.enable_grad():
            leaves = [t.detach().requires_grad_() for t in (x, weight, bias)]
            return torch.autograd.grad(_StandInConv.compute(*leaves), leaves, grad)


def test_causal_conv1d_folds_members_into_channels():
    def kernel(x, weight, bias, activation):
        assert activation == "silu"
        return _StandInConv.apply(x, weight, bias)

    x, weight, bias = _leaves(
        (MEMBERS, 2, 5, 8), (MEMBERS, 5, 4), (MEMBERS, 5), generator=torch.Generator().manual_seed(4)
    )
    _vmap_equals_loop(lambda x, w, b: causal_conv1d_silu(kernel, x, w, b), [x, weight, bias])
    with pytest.raises(RuntimeError, match="setup_context|vmap support"):  # what the fold spares
        torch.func.vmap(lambda x, w, b: kernel(x, w, b, "silu"))(x, weight, bias)


def test_linear_recurrences_fold_members_into_the_batch():
    """GLA's chunked form (its chunk size read from the data), the decay and delta forms (fla's
    kernels on CUDA, the chunked forms here): one call for all members."""
    gen = torch.Generator().manual_seed(5)
    q, k, v = _leaves(*[(MEMBERS, 2, 3, 11, 4)] * 3, generator=gen)
    gates = F.logsigmoid(torch.randn(MEMBERS, 2, 3, 11, 4, dtype=f64, generator=gen) + 2).requires_grad_()
    decay = F.logsigmoid(torch.randn(MEMBERS, 2, 3, 11, dtype=f64, generator=gen) + 2).requires_grad_()
    beta = torch.rand(MEMBERS, 2, 3, 11, dtype=f64, generator=gen).requires_grad_()
    _vmap_equals_loop(lambda q, k, v, g: gla_chunked(q, k, v, g, chunk_size=4), [q, k, v, gates])
    _vmap_equals_loop(lambda q, k, v, g: decay_parallel(q, k, v, g, chunk_size=4), [q, k, v, decay])
    _vmap_equals_loop(
        lambda q, k, v, b, g: delta_parallel(q, k, v, b, g, chunk_size=4), [q, F.normalize(k, dim=-1), v, beta, decay]
    )


def test_an_op_vmap_passes_no_member_axis_runs_as_it_is():
    """Inside vmap, a folded op whose inputs are all unbatched runs once as it is (and is
    differentiated by recomputation): the same values and gradients."""
    gen = torch.Generator().manual_seed(6)
    q, k, v = _leaves(*[(2, 3, 5, 4)] * 3, generator=gen)
    scales = torch.rand(MEMBERS, dtype=f64, generator=gen).requires_grad_()
    got = torch.func.vmap(lambda s: scaled_dot_product_attention(q, k, v, is_causal=True) * s)(scales)
    grads = torch.autograd.grad(got.square().sum(), [q, k, v, scales])
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True) * scales.view(-1, 1, 1, 1, 1)
    for g, w in zip((got, *grads), (want, *torch.autograd.grad(want.square().sum(), [q, k, v, scales]))):
        torch.testing.assert_close(g, w)


def test_outside_vmap_nothing_is_wrapped():
    """The unbatched path is the op itself (no autograd.Function around it)."""
    assert not member_fold.active()
    args = _scan_args(torch.Generator().manual_seed(7))
    assert type(selective_scan(*args).grad_fn).__name__ == "SelectiveScanCPUBackward"
    q = torch.randn(1, 1, 3, 2, requires_grad=True)
    assert "_Folded" not in type(scaled_dot_product_attention(q, q, q).grad_fn).__name__


def test_torch_func_grad_through_a_fold_is_a_clear_error():
    q = torch.randn(MEMBERS, 1, 2, 3, 4, dtype=f64)

    def loss(q):
        return torch.func.vmap(lambda q: scaled_dot_product_attention(q, q, q, is_causal=True))(q).sum()

    with pytest.raises(NotImplementedError, match="not torch.func.grad"):
        torch.func.grad(loss)(q)


def _layer_cases():
    """Every registered primitive at a tiny width (mamba2 with a head that fits it), and every
    Hyena filter family."""
    sizes = {"mamba2": {"head_dim": 8, "d_state": 8}}
    cases = [(name, sizes.get(name, {})) for name in primitives()]
    cases += [("hyena", {"filter": f}) for f in ("s4d", "rational", "conv1d", "fno", "ckconv", "hyena")]
    cases += [("moe", {"experts": 8, "active": 2, "expert_width": 64})]  # wide experts: gather, dense under vmap
    return cases


@pytest.mark.parametrize(
    "name, overrides",
    _layer_cases(),
    ids=lambda c: str(c) if isinstance(c, str) else "-".join(f"{k}={v}" for k, v in c.items()) or "defaults",
)
def test_every_layer_declares_stacks_and_is_exact_under_vmap(name, overrides):
    """Every layer declares `stacks` (madsl.runner.batched.stacked), and where it is True it holds: vmap
    over members' stacked parameters equals each member's own forward and parameter gradients
    (MoE's balancing loss included)."""
    p = primitive(name, 16, **overrides)
    models = []
    for seed in range(MEMBERS):
        torch.manual_seed(seed)
        models.append(p.build().double())
    declared = getattr(type(models[0]), "stacks", None)
    assert declared in (True, False), f"{type(models[0]).__name__} must declare `stacks` (True, or False and why)"
    if not declared:
        return  # trains in lockstep
    params, buffers = torch.func.stack_module_state(models)
    x = torch.randn(MEMBERS, 2, 12, 16, dtype=f64, generator=torch.Generator().manual_seed(8))
    if hasattr(models[0], "embeddings"):  # Zs reads the model's token embeddings: one fixed e for every member
        from madsl.layers.zamba import EmbeddingLink

        link = EmbeddingLink()
        link.value = torch.randn(2, 12, 16, dtype=f64, generator=torch.Generator().manual_seed(9))
        for model in models:
            model.embeddings = link

    def loss(model, *state_and_x):
        out = (
            torch.func.functional_call(model, state_and_x[:2], (state_and_x[2],))
            if len(state_and_x) == 3
            else model(state_and_x[0])
        )
        aux = getattr(model, "aux_loss", None)
        return out.square().mean() + (aux if isinstance(aux, torch.Tensor) else 0.0)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        losses = torch.func.vmap(lambda pp, bb, xx: loss(models[0], pp, bb, xx))(params, buffers, x)
    names = [n for n, t in params.items() if t.requires_grad]
    grads = torch.autograd.grad(losses.sum(), [params[n] for n in names], allow_unused=True)
    for m, model in enumerate(models):
        want_loss = loss(model, x[m])
        torch.testing.assert_close(losses[m], want_loss, atol=1e-12, rtol=1e-10)
        own = dict(model.named_parameters())
        want = torch.autograd.grad(want_loss, [own[n] for n in names], allow_unused=True)
        for n, g, w in zip(names, grads, want):
            torch.testing.assert_close(
                g[m] if g is not None else torch.zeros_like(own[n]),
                w if w is not None else torch.zeros_like(own[n]),
                atol=1e-12,
                rtol=1e-9,
                msg=n,
            )


def test_a_layer_without_the_declaration_trains_in_lockstep():
    class Undeclared(torch.nn.Module):
        def forward(self, x):
            return x

    model = torch.nn.Sequential(torch.nn.Linear(2, 2), Undeclared())
    model.kind = "classes"
    assert not batchable([model, model])
    model[1] = torch.nn.Identity()
    assert batchable([model, model])
