"""Analytic accounting against the MAD paper's numbers (App. B.3, Table C.2, §2.2)."""

import glob

import pytest

from madsl import account, load_spec, spec_from_topology
from madsl.errors import MadslError

# fixed state per layer at width 128 with the paper's settings (App. B.3 / issue conventions)
STATE_AT_128 = {"H": 2048, "mH": 16 * 8 * 8 * 2, "He": 2048, "Mb": 256 * 4, "mAlg": 8 * 16 * 16, "A": 0, "mA": 0}


@pytest.mark.parametrize("symbol,state", list(STATE_AT_128.items()))
def test_fixed_state_of_each_mad_sequence_mixer(symbol, state):
    (row, *_) = account(spec_from_topology(symbol)).layers
    assert row.fixed_state == state


def test_alg_needs_a_smaller_key_dim_for_iso_state():
    assert account(spec_from_topology("Alg-none")).layers[0].fixed_state == 128 * 128
    assert account(spec_from_topology("Alg{key_dim=16}")).layers[0].fixed_state == 2048


def test_kv_cache_and_conv_state():
    acc = account(spec_from_topology("mA:Mb:H", seq_len=512))
    mA, _, Mb, H, _ = acc.layers
    assert mA.kv_cache == 2 * 16 * 8 * 512 and mA.fixed_state == 0
    assert Mb.conv_state == 256 * 3 and H.conv_state == 3 * 128 * 2


NON_ATTENTION = [p for p in glob.glob("specs/paper/*.mad") if "attention" not in p and "striped" not in p]


def test_every_non_attention_mad_architecture_totals_4096():
    assert len(NON_ATTENTION) == 11
    for path in NON_ATTENTION:
        assert account(load_spec(path)).totals["fixed_state"] == 4096, path


def test_striped_architectures_total_2048_and_every_bundled_budget_holds():
    from madsl.lang.budget import check

    for path in glob.glob("specs/paper/*.mad") + glob.glob("specs/topologies/*.mad"):
        spec = load_spec(path)
        acc = account(spec, seq_len=spec.budget_seq_len)
        assert not check(acc.totals, spec.budget), path
        if "striped" in path:
            assert acc.totals["fixed_state"] == 2048


def test_exact_parameter_counts_by_hand():
    # Mamba at width 128 (mamba-ssm layout): in_proj 128*512, conv 256*4 + bias 256, x_proj 256*16,
    # dt_proj 8*256+256, A_log 256*4, D 256, out_proj 256*128, plus a pre-norm of 128
    (mb,) = account(spec_from_topology("Mb")).layers
    assert mb.params == 65536 + 1024 + 256 + 4096 + 2304 + 1024 + 256 + 32768 + 128
    # SwiGLU 3*128*512 and attention 4*128*128, each with its pre-norm
    a, sg = account(spec_from_topology("A")).layers
    assert sg.params == 3 * 128 * 512 + 128 and a.params == 4 * 128 * 128 + 128


def test_shared_tags_count_parameters_once_and_state_per_use():
    plain = account(spec_from_topology("H:A:H")).totals
    shared = account(spec_from_topology("H#a:A:H#a")).totals
    (h, *_) = account(spec_from_topology("H-none")).layers
    assert plain["params"] - shared["params"] == h.params
    assert plain["fixed_state"] == shared["fixed_state"] == 2 * 2048


def test_parallel_branches_share_one_norm_and_gated_groups_add_a_gate():
    par = account(spec_from_topology("[H | mA]-none")).layers
    assert [r.norm_params for r in par] == [128, 0]
    gated = account(spec_from_topology("(H:A){residual=gated}")).totals["params"]
    plain = account(spec_from_topology("H:A")).totals["params"]
    assert gated - plain == 128 * 128 + 128


# Table C.2 (Transformer++ rows): width, FFW, kv size, heads, layers -> nominal millions.
TABLE_C2 = [
    (756, 1536, 4096, 128, 12, 24),
    (350, 1024, 2736, 64, 16, 24),
    (1300, 2048, 5456, 128, 16, 24),
    (7000, 3712, 9904, 128, 29, 41),
    (150, 768, 2048, 64, 12, 16),
]


@pytest.mark.parametrize("nominal,dim,ffw,kv,heads,layers", TABLE_C2)
def test_transformer_sizes_of_table_c2(nominal, dim, ffw, kv, heads, layers):
    spec = spec_from_topology(
        f"{layers}A", dim=dim, vocab=50257, layers={"A": {"heads": heads, "head_dim": kv}, "Sg": {"inner": ffw}}
    )
    params = account(spec).totals["params"]
    # "actual parameter counts vary slightly for each architecture" (Table C.2 caption)
    assert abs(params / (nominal * 1e6) - 1) < 0.06, params


def test_table_d1_topologies_at_750m():
    for path in glob.glob("specs/topologies/d1-*.mad"):
        acc = account(load_spec(path))
        assert abs(acc.totals["params"] / 756e6 - 1) < 0.01, path
        assert len(acc.layers) == 48  # 24 blocks: a sequence mixer and a SwiGLU each


def test_flops_follow_app_c4():
    L, D = 2048, 1536
    spec = spec_from_topology("A-none", dim=D, seq_len=L, layers={"A": {"heads": 12, "head_dim": 128}})
    (a,) = account(spec).layers
    assert a.flops == 6 * L * D * D + 4 * L * L * D + 2 * 12 * L * L + 2 * L * D * D
    (sg,) = account(spec_from_topology("A-Sg", dim=D, seq_len=L)).layers[1:]
    assert sg.flops == 6 * L * D * (4 * D)  # SwiGLU inner 4 * dim (512 at width 128)
    (h,) = account(spec_from_topology("H-none", dim=D, seq_len=L)).layers
    import math

    assert (
        h.flops
        == 6 * L * D * D + 18 * L * D + 16 * L * D + round(10 * L * math.log2(L) * D) + 4 * L * D + 2 * L * D * D
    )


def test_seven_billion_parameter_topology_accounts_without_torch():
    import subprocess
    import sys

    code = (
        "import sys, madsl; s = madsl.spec_from_topology('(H:A)x41', dim=3712, vocab=50257, "
        "layers={'Sg': {'inner': 9904}, 'A': {'heads': 29, 'head_dim': 128}}); "
        "t = madsl.account(s).totals; assert t['params'] > 6e9, t; assert 'torch' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_width_relative_defaults_scale_with_the_width_and_keep_width_128_identities():
    """The paper's sizes at width 128 that are multiples of it (SwiGLU inner 512 = 4 * dim, mA's
    16 heads of width 8 = dim / 8 heads, experts of width 16 = dim / 8) scale; their identities at
    width 128 are the numbers (tests/test_sliding_window.py pins stored ones)."""

    def config(topology: str, dim: int, index: int) -> dict:
        return account(spec_from_topology(topology, dim=dim)).layers[index].config

    assert config("mA-Sg", 128, 1)["inner"] == 512 and config("mA-Sg", 768, 1)["inner"] == 3072
    assert config("mA-Sg", 128, 0)["heads"] == 16 and config("mA-Sg", 768, 0)["heads"] == 96
    assert config("mA{heads=4}-Sg", 768, 0)["head_dim"] == 8  # an explicit head count keeps the width 8
    assert config("H-MoE", 768, 1)["expert_width"] == 96 and config("He-Sg", 768, 0)["expert_width"] == 96
    identity = spec_from_topology("mA-MoE", dim=128).identity()["layers"]
    assert identity["mA"]["params"]["heads"] == 16 and identity["MoE"]["params"]["expert_width"] == 16
    assert spec_from_topology("H-MoE{expert_width=10}", dim=100)  # an explicit value needs no scaling
    with pytest.raises(MadslError, match="expert_width defaults to dim / 8.*width 100") as err:
        spec_from_topology("H-MoE", dim=100)
    assert "set expert_width explicitly" in err.value.hint


# ---- active parameters: what one token's output reads ----------------------------------------------


def test_a_moe_counts_its_router_shared_expert_and_chosen_experts_active():
    D, E, W, k, S = 128, 16, 16, 4, 32
    spec = spec_from_topology(f"A-MoE{{experts={E},active={k},shared_width={S}}}", dim=D)
    attention, moe = account(spec).layers
    assert attention.active_params == attention.params == 4 * D * D + D
    assert moe.params == D * E + 3 * D * S + E * 3 * D * W + D  # router, shared expert, experts, pre-norm
    assert moe.active_params == D * E + 3 * D * S + k * 3 * D * W + D
    # the MAD reference's dense down projection reads every expert's hidden units
    (_, dense) = account(spec_from_topology(f"A-MoE{{experts={E},active={k},dense_down=true}}", dim=D)).layers
    assert dense.active_params == D * E + 2 * E * D * W + k * E * W * D + D
    # leaky routing weights every expert: all are active
    (_, leaky) = account(spec_from_topology("A-MoE{leaky_routing=true}")).layers
    assert leaky.active_params == leaky.params


def test_hyena_experts_count_the_weighted_experts_channels_active():
    (he,) = account(spec_from_topology("He-none")).layers
    # width 128, 8 experts of 16 channels, 2 weighted; in_proj 128 -> 384 and out_proj 16 -> 128 with
    # biases, short conv 3 taps with bias, modal filter 4 * 16 numbers per channel, router 128 -> 8
    unread_channels = 6 * 16
    assert he.params == 128 * 8 + (128 * 384 + 384) + (384 * 3 + 384) + 4 * 16 * 128 + (16 * 128 + 128) + 128
    # per unweighted channel: 3 in_proj rows (128 weights and a bias), 3 short-conv channels (3 taps and
    # a bias), its modal filter (4 * 16)
    assert he.active_params == he.params - unread_channels * (3 * 129 + 3 * 4 + 4 * 16)
    assert he.active_params == 18_144


def test_dense_models_count_every_parameter_active_and_the_ends_count_in_both():
    dense = account(spec_from_topology("H:mA:Mb:M2", vocab=1000)).totals
    assert dense["active_params"] == dense["params"]
    routed = account(spec_from_topology("A-MoE", vocab=1000)).totals
    without = account(spec_from_topology("A-MoE")).totals
    # the embedding (tied head) is read by every token: it adds the same to both counts
    assert routed["params"] - without["params"] == routed["active_params"] - without["active_params"] == 1000 * 128
    assert routed["active_params"] < routed["params"]


def test_a_shared_routed_layer_counts_its_active_parameters_once():
    once = account(spec_from_topology("A-MoE")).totals
    shared = account(spec_from_topology("A-MoE#m:A-MoE#m"))
    attention = 4 * 128 * 128 + 128  # the second block's attention and its pre-norm
    assert shared.totals["active_params"] - once["active_params"] == attention
    assert shared.totals["params"] - once["params"] == attention
    assert shared.layers[3].shared and shared.layers[3].active_params == shared.layers[3].params == 0


@pytest.mark.parametrize("name,total,active", [("jamba-v0.1", 52, 12), ("granite-4.0-h-small", 32, 9)])
def test_public_moe_hybrids_come_out_as_they_are_quoted(name, total, active):
    """The model cards quote Jamba as 52B total, 12B active, and Granite-4.0-H-Small as 32B, 9B."""
    from madsl.report_text import params_quote

    totals = account(f"specs/public/{name}.mad").totals
    assert round(totals["params"] / 1e9) == total and round(totals["active_params"] / 1e9) == active
    assert params_quote(totals["params"], totals["active_params"]).endswith(f"-A{totals['active_params'] / 1e9:.3g}B")


def test_params_are_quoted_as_models_are():
    from madsl.report_text import params_quote

    assert params_quote(30.5e9, 3.3e9) == "30.5B-A3.3B"
    assert params_quote(7e9, 7e9) == "7B"
    assert params_quote(225_920, 63_296) == "226k-A63.3k"


def test_a_budget_bounds_the_active_parameters_and_fit_solves_for_them(tmp_path):
    from madsl.fit import solve
    from madsl.lang.budget import check

    path = tmp_path / "moe.mad"
    path.write_text(
        "name: moe\ndim: 128\ntopology: (A-MoE)x2\nlayers:\n  MoE: {experts: 16, active: 1}\n"
        "budget:\n  params: <= 1M\n  active_params: 200k ± 3%\n  fit: [MoE.active]\n"
    )
    spec = load_spec(path)
    totals = account(spec).totals
    (violation,) = check(totals, spec.budget)  # the total is within its bound, the active count is not
    assert violation.quantity == "active_params" and violation.actual == totals["active_params"]
    best = solve(spec, spec.fit).best
    assert best.values == {"MoE.active": 5} and abs(best.totals["active_params"] / 200e3 - 1) <= 0.03
    path.write_text("name: moe\ndim: 128\ntopology: A-MoE\nbudget:\n  active_param: 1M\n")
    with pytest.raises(MadslError, match="unknown budget 'active_param'") as err:
        load_spec(path)
    assert "active_params" in str(err.value.hint)


def run_cli(capsys, *args: str) -> tuple[int, str]:
    from madsl.cli import main

    rc = main(list(args))
    return rc, capsys.readouterr().out


def test_compile_and_check_show_the_active_parameters_where_experts_are_routed(capsys):
    import json

    rc, text = run_cli(capsys, "compile", "specs/paper/hyena-experts-moe.mad")
    assert rc == 0 and "226k-A63.3k params" in text and "active params" in text
    assert "18,144" in text and "13,440" in text and "63,296" in text  # He, MoE rows and the total
    rc, text = run_cli(capsys, "compile", "specs/paper/hyena-sg.mad")
    assert rc == 0 and "545k params" in text and "active params" not in text
    rc, out = run_cli(capsys, "compile", "specs/paper/hyena-experts-moe.mad", "--format", "json")
    data = json.loads(out)
    assert data["totals"]["active_params"] == 63_296 and data["totals"]["params"] == 225_920
    assert data["totals"]["active_params"] == sum(r["active_params"] for r in data["layers"]) + sum(
        p["active_params"] for p in data["parts"]
    )
    rc, text = run_cli(capsys, "check", "specs/paper/hyena-experts-moe.mad", "specs/paper/hyena-sg.mad")
    assert rc == 0 and "active params" in text and "63,296" in text
    rc, text = run_cli(capsys, "check", "specs/paper/hyena-sg.mad")
    assert rc == 0 and "active params" not in text
    rc, out = run_cli(capsys, "check", "specs/paper/hyena-experts-moe.mad", "--format", "json")
    assert json.loads(out)["specs"][0]["totals"]["active_params"] == 63_296


def test_total_state_is_the_fixed_state_plus_the_kv_cache_and_a_budget_can_bound_it():
    """`total_state` (the paper's total state, STAR's cache objective): a striped hybrid's recurrent
    state plus its attention's KV cache at the accounted length; the conv state is stated apart."""
    from madsl.lang.budget import check, parse_bound

    for topology in ("H-Sg:A-Sg", "mA:mA", "Mb-Sg"):
        totals = account(spec_from_topology(topology, dim=64, seq_len=128)).totals
        assert totals["total_state"] == totals["fixed_state"] + totals["kv_cache"]
    striped = account(spec_from_topology("H-Sg:A-Sg", dim=64, seq_len=128)).totals
    assert striped["kv_cache"] > 0 and striped["fixed_state"] > 0
    bound = striped["total_state"] - 1
    (violation,) = check(striped, {"total_state": parse_bound(f"<= {bound}")})
    assert violation.quantity == "total_state"
