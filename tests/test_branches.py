"""Groups of parallel branches, `(X | Y){split=..., combine=...}` (seed 004's HybridModel), and
the group attributes `norm=` and `linear_std=` and the model-wide `final_norm`: what they
compute, what they count, and the located errors of bad values."""

from __future__ import annotations

import pytest
import torch

import madsl
from madsl import topology as topo
from madsl.errors import MadslError
from madsl.model_parts import Fork
from madsl.spec import spec_from_topology

D = 16


def _spec(tmp_path, topology: str, extra: str = ""):
    path = tmp_path / "b.mad"
    path.write_text(f"name: b\ndim: {D}\nseq_len: 8\nchannel_mixer: none\n{extra}topology: '{topology}'\n")
    return madsl.load_spec(path)


def test_branches_parse_print_and_drop_the_default_projectors():
    t = topo.parse("(A:A | 2Mb){split=res, combine=gated}x2")
    assert topo.canonical(t) == "2(2A | 2Mb){combine=gated,split=res}"
    assert topo.expand(topo.parse(topo.canonical(t))) == topo.expand(t)
    assert topo.size(t) == 8
    # copy / mean are what a bare group of branches already is: one architecture, one identity
    assert topo.canonical(topo.parse("(A | Mb){split=copy, combine=mean}")) == "(A | Mb)"
    # a group of branches is kept by expand even without attributes; a plain group is not
    assert isinstance(topo.expand(topo.parse("(A | Mb)"))[0], topo.Group)
    assert topo.expand(topo.parse("(A:Mb)")) == topo.expand(topo.parse("A:Mb"))


@pytest.mark.parametrize("split", ["copy", "res", "gated", "gated_soft"])
@pytest.mark.parametrize("combine", ["mean", "res", "gated", "gated_soft"])
def test_projectors_are_counted_as_built(tmp_path, split, combine):
    spec = _spec(tmp_path, f"(A:A | Mb){{split={split}, combine={combine}}}")
    account = madsl.account(spec, vocab=10)
    model = madsl.compile(spec, vocab_size=10)
    assert account.totals["params"] == sum(p.numel() for p in model.parameters())
    parts = {p.name.split("[")[0]: p for p in account.parts}
    # two branches: a Linear(D, D) with bias each, and a gate each (gated) or one for both (gated_soft)
    expected = {
        "copy": 0,
        "mean": 0,
        "res": 2 * (D * D + D),
        "gated": 2 * (D * D + D + 1),
        "gated_soft": 2 * (D * D + D) + 1,
    }
    for role, kind in (("split", split), ("combine", combine)):
        if expected[kind]:
            assert parts[f"group_{role}"].params == expected[kind]
            assert parts[f"group_{role}"].flops == 2 * 2 * 8 * D * D  # two Linear(D, D) over 8 positions
        else:
            assert f"group_{role}" not in parts


def test_gated_branches_compute_the_study_projectors():
    model = madsl.compile(spec_from_topology("(A-none | Mb){split=gated, combine=gated}"), vocab_size=10).double()
    fork = model.body[0]
    assert isinstance(fork, Fork)
    with torch.no_grad():
        fork.split.alpha.copy_(torch.tensor([0.3, 0.6]))
        fork.combine.alpha.copy_(torch.tensor([0.8, -0.2]))
    x = torch.randn(2, 5, model.dim, dtype=torch.float64)
    s, c = fork.split, fork.combine
    y = [branch((1 - a) * p(x) + a * x) for branch, p, a in zip(fork.branches, s.proj, s.alpha)]
    y = [(1 - a) * p(y_i) + a * y_i for y_i, p, a in zip(y, c.proj, c.alpha)]
    w = torch.softmax(c.alpha, dim=0)
    torch.testing.assert_close(fork(x), w[0] * y[0] + w[1] * y[1])


def test_gated_soft_branches_weigh_each_side_by_softmax_of_a_and_one_minus_a():
    model = madsl.compile(spec_from_topology("(A-none | Mb){split=gated_soft, combine=gated_soft}"), vocab_size=10)
    fork = model.body[0]
    with torch.no_grad():
        fork.split.alpha.fill_(0.3)
        fork.combine.alpha.fill_(-0.4)
    x = torch.randn(2, 5, model.dim)
    s = torch.softmax(torch.tensor([0.3, 0.7]), dim=0)
    c = torch.softmax(torch.tensor([-0.4, 1.4]), dim=0)
    y = [branch((1 - g) * p(x) + g * x) for branch, p, g in zip(fork.branches, fork.split.proj, s)]
    y = [(1 - g) * p(y_i) + g * y_i for y_i, p, g in zip(y, fork.combine.proj, c)]
    torch.testing.assert_close(fork(x), c[0] * y[0] + c[1] * y[1])


def test_copy_mean_branches_average_the_branches_and_res_adds_the_projections():
    model = madsl.compile(spec_from_topology("(A-none | Mb)"), vocab_size=10)
    fork = model.body[0]
    x = torch.randn(2, 5, model.dim)
    torch.testing.assert_close(fork(x), (fork.branches[0](x) + fork.branches[1](x)) / 2)
    model = madsl.compile(spec_from_topology("(A-none | Mb){split=res, combine=res}"), vocab_size=10)
    fork = model.body[0]
    s, c = fork.split.proj, fork.combine.proj
    y = [branch(x + p(x)) for branch, p in zip(fork.branches, s)]
    torch.testing.assert_close(fork(x), sum(y_i + p(y_i) for y_i, p in zip(y, c)) / 2)


def test_a_group_norm_and_linear_std_reach_only_its_layers(tmp_path):
    spec = _spec(tmp_path, "((A-Mlp){norm=layer, linear_std=0.01} | Mb){split=res}", "final_norm: false\n")
    model = madsl.compile(spec, vocab_size=10)
    neo, mamba = model.body[0].branches

    def norms(module):
        return [type(m) for m in module.modules() if isinstance(m, (torch.nn.LayerNorm, torch.nn.RMSNorm))]

    assert norms(neo) == [torch.nn.LayerNorm] * 2 and norms(mamba) == [torch.nn.RMSNorm]
    attention = neo[0][0].mixer.layer
    assert attention.qkv.weight.std().item() == pytest.approx(0.01, rel=0.2)
    # Mamba's Linears and the projectors keep their own (torch default) init: U(+-1/sqrt(fan_in))
    assert mamba[0].mixer.layer.in_proj.weight.std().item() == pytest.approx((3 * D) ** -0.5, rel=0.2)
    assert model.body[0].split.proj[0].weight.std().item() == pytest.approx((3 * D) ** -0.5, rel=0.2)
    assert isinstance(model.final_norm, torch.nn.Identity)
    account = madsl.account(spec, vocab=10)
    assert "final_norm" not in {p.name for p in account.parts}
    assert account.totals["params"] == sum(p.numel() for p in model.parameters())
    assert [r.norm_params for r in account.layers] == [2 * D, 2 * D, D]  # LayerNorm: weight and bias
    assert spec.identity()["final_norm"] is False
    assert "final_norm" not in _spec(tmp_path, "A").identity()  # at its default: existing identities hold


@pytest.mark.parametrize(
    "topology, column, message",
    [
        ("(A:A){split=res}", 7, "split applies to a group of branches"),
        ("(A | Mb){combine=sum}", 18, "combine must be one of mean, res, gated, gated_soft"),
        ("(A | Mb | H){split=gated_soft}", 20, "split=gated_soft joins exactly two branches, and this group has 3"),
        ("(A | Mb){norm=batch}", 15, "norm must be one of rms, layer"),
        ("(A | Mb){linear_std=0}", 21, "linear_std must be a positive number"),
        ("(A | Mb){linear_std=big}", 21, "linear_std must be a positive number"),
        ("(A | Mb){spilt=res}", 10, "unknown group attribute 'spilt'"),
    ],
)
def test_bad_group_attributes_are_located_errors(tmp_path, capsys, topology, column, message):
    path = tmp_path / "bad.mad"
    path.write_text(f"name: bad\ndim: 16\ntopology: '{topology}'\n")
    with pytest.raises(MadslError, match=message):
        madsl.load_spec(path)
    from madsl.cli import main

    assert main(["check", str(path), "--format", "line"]) == 2
    out = capsys.readouterr().out
    assert out.startswith(f"{path}:3:{11 + column}: error: {message}")
