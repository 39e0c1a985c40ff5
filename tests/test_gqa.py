"""Grouped-query attention (`A{kv_heads=k}`): k key/value heads shared by heads / k query heads;
the accounting counts the smaller key/value projections and KV cache, the module repeats
each key/value head for its query heads, and the default (null = heads) is multi-head
attention with the identity it always had."""

from __future__ import annotations

import pytest
import torch
from layer_helpers import make, n_params, run_steps

import madsl
from madsl.errors import MadslError


def _as_multi_head(gqa) -> torch.nn.Module:
    """A multi-head attention module computing what `gqa` computes: its key/value weights
    repeated for the query heads that read them (query head h reads key/value head h // groups)."""
    _, mha = make("attention", gqa.dim, heads=gqa.heads, rotary=gqa.rotary, window=gqa.window)
    hd, inner, kv = gqa.head_dim, gqa.heads * gqa.head_dim, gqa.kv_heads * gqa.head_dim
    weight = gqa.qkv.weight.detach()
    q, k, v = weight[:inner], weight[inner : inner + kv], weight[inner + kv :]

    def repeat(w):
        return w.view(gqa.kv_heads, hd, -1).repeat_interleave(gqa.groups, 0).reshape(inner, -1)

    with torch.no_grad():
        mha.qkv.weight.copy_(torch.cat((q, repeat(k), repeat(v))))
        mha.out.weight.copy_(gqa.out.weight)
    return mha.to(gqa.out.weight.dtype)


@pytest.mark.parametrize("kv_heads,window", [(2, None), (1, None), (2, 3)])
def test_grouped_attention_is_multi_head_attention_with_shared_keys_and_values(kv_heads, window):
    torch.manual_seed(0)
    prim, gqa = make("attention", 32, heads=4, kv_heads=kv_heads, window=window)
    gqa = gqa.double()
    x = torch.randn(2, 9, 32, dtype=torch.float64)
    expected = _as_multi_head(gqa)(x)
    torch.testing.assert_close(gqa(x), expected)
    stepped, state = run_steps(gqa, x)
    torch.testing.assert_close(stepped, expected)
    # the cache holds kv_heads heads (a window's ring buffer as well), as the accounting counts
    assert state["k"].shape[1] == kv_heads
    assert state["k"][0].numel() + state["v"][0].numel() == prim.kv_cache(9) == 2 * kv_heads * 8 * min(9, window or 9)


def test_the_accounting_counts_query_and_output_projections_full_and_keys_values_at_kv_heads():
    prim, module = make("attention", 64, heads=8, kv_heads=2)
    mha, _ = make("attention", 64, heads=8)
    assert prim.params() == n_params(module) == 64 * 64 * 2 + 2 * 64 * 16  # q, out; k, v of 2 x 8
    assert prim.kv_cache(100) == mha.kv_cache(100) // 4
    assert prim.flops(100) == mha.flops(100) - 2 * 2 * 100 * 64 * (64 - 16)


def test_kv_heads_must_divide_heads_with_a_located_error(tmp_path):
    path = tmp_path / "gqa.mad"
    path.write_text("name: gqa\ndim: 64\ntopology: A:H\nlayers:\n  A: {heads: 8, kv_heads: 3}\n")
    with pytest.raises(MadslError) as err:
        madsl.load_spec(path)
    assert err.value.location.line == 5 and "kv_heads=3 does not divide heads=8" in str(err.value)
    assert "1, 2, 4, 8" in (err.value.hint or "")


def test_kv_heads_null_keeps_the_identity_and_fewer_changes_it():
    mha = madsl.spec_from_topology("mA:H", dim=128)
    assert madsl.spec_from_topology("mA{kv_heads=null}:H", dim=128).identity() == mha.identity()
    assert madsl.spec_from_topology("mA{kv_heads=4}:H", dim=128).identity() != mha.identity()
