"""Sliding-window attention (`A{window=w}`): a banded causal mask in the parallel form, a
bounded ring buffer in step mode, and the KV cache and FLOPs counted over the window."""

from __future__ import annotations

import math

import pytest
import torch
from layer_helpers import make, run_steps

import madsl


def _reference(module, x: torch.Tensor, window: int) -> torch.Tensor:
    """Softmax attention written out per query over its last `window` keys (rotary included)."""
    batch, length, _ = x.shape
    q, k, v = module.qkv(x).view(batch, length, 3, module.heads, module.head_dim).permute(2, 0, 3, 1, 4)
    cos, sin = module._rotary_tables(length, x)

    def rot(t):
        return (
            t * cos[:length] + torch.cat((-t[..., t.shape[-1] // 2 :], t[..., : t.shape[-1] // 2]), -1) * sin[:length]
        )

    q, k = rot(q), rot(k)
    rows = []
    for t in range(length):
        lo = max(0, t - window + 1)
        scores = (q[:, :, t : t + 1] @ k[:, :, lo : t + 1].transpose(-1, -2)) / math.sqrt(module.head_dim)
        rows.append(scores.softmax(-1) @ v[:, :, lo : t + 1])
    y = torch.cat(rows, dim=2).transpose(1, 2).reshape(batch, length, -1)
    return module.out(y)


@pytest.mark.parametrize("window", [1, 3, 7])
def test_window_attends_to_the_last_w_tokens_in_both_forms(window):
    torch.manual_seed(0)
    prim, module = make("attention", 32, heads=2, window=window)
    module = module.double()
    x = torch.randn(2, 12, 32, dtype=torch.float64)
    expected = _reference(module, x, window)
    torch.testing.assert_close(module(x), expected)
    stepped, state = run_steps(module, x)
    torch.testing.assert_close(stepped, expected)
    assert state["k"].shape[2] == state["v"].shape[2] == window  # bounded: the ring buffer
    assert prim.kv_cache(12) == 2 * 32 * window and prim.kv_cache(2) == 2 * 32 * min(2, window)


def test_a_window_as_long_as_the_sequence_is_full_attention():
    torch.manual_seed(0)
    prim, windowed = make("attention", 32, heads=2, window=16)
    full_prim, full = make("attention", 32, heads=2)
    full.load_state_dict(windowed.state_dict())
    x = torch.randn(2, 16, 32)
    torch.testing.assert_close(windowed(x), full(x))
    assert prim.flops(16) == full_prim.flops(16) and prim.flops(64) < full_prim.flops(64)
    assert prim.kv_cache(64) == full_prim.kv_cache(16)


# Identities of bundled specs with attention, as stored before `window` existed: a parameter
# added at its null default must not move the runs a results store already holds.
STORED_IDENTITIES = {
    "specs/paper/mh-attention-sg.mad": "f79c7cbf25432160a6ccadf5dc863c6714b63e6e49aa78b54544b9cb17d25e04",
    "specs/paper/attention-moe.mad": "ac7cbec18e1ac26a812c3fcafb537a43f42a9ea7c8f1789ab696feb600072354",
    "specs/induction/attention-rope.mad": "39cacf0d76edca22a5a2b08d14e1e7351d97bd83094fdc7f9bc49524c81939c6",
}


@pytest.mark.parametrize("path", sorted(STORED_IDENTITIES))
def test_specs_without_a_window_keep_their_identity(path):
    assert madsl.load_spec(path).hash == STORED_IDENTITIES[path]


def test_a_window_changes_the_identity_and_a_restated_default_does_not():
    full = madsl.spec_from_topology("mA:H", dim=128)
    assert madsl.spec_from_topology("mA{window=32}:H", dim=128).identity() != full.identity()
    assert madsl.spec_from_topology("mA{window=null}:H", dim=128).identity() == full.identity()
