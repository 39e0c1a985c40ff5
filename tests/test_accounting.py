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
    from madsl.budget import check

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
TABLE_C2 = [(756, 1536, 4096, 128, 12, 24), (350, 1024, 2736, 64, 16, 24), (1300, 2048, 5456, 128, 16, 24),
            (7000, 3712, 9904, 128, 29, 41), (150, 768, 2048, 64, 12, 16)]


@pytest.mark.parametrize("nominal,dim,ffw,kv,heads,layers", TABLE_C2)
def test_transformer_sizes_of_table_c2(nominal, dim, ffw, kv, heads, layers):
    spec = spec_from_topology(f"{layers}A", dim=dim, vocab=50257,
                              layers={"A": {"heads": heads, "head_dim": kv}, "Sg": {"inner": ffw}})
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
    assert h.flops == 6 * L * D * D + 18 * L * D + 16 * L * D + round(10 * L * math.log2(L) * D) + 4 * L * D \
        + 2 * L * D * D


def test_seven_billion_parameter_topology_accounts_without_torch():
    import subprocess
    import sys

    code = ("import sys, madsl; s = madsl.spec_from_topology('(H:A)x41', dim=3712, vocab=50257, "
            "layers={'Sg': {'inner': 9904}, 'A': {'heads': 29, 'head_dim': 128}}); "
            "t = madsl.account(s).totals; assert t['params'] > 6e9, t; assert 'torch' not in sys.modules")
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
