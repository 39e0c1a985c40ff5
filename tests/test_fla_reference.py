"""madsl's linear-recurrence kernels against flash-linear-attention's own naive reference
functions (`fla/ops/<op>/naive.py`, plain PyTorch, float32): an independent, maintained
statement of each recurrence (GLA, DeltaNet, Gated DeltaNet, retention, linear attention),
layouts and scale conventions included, beside the float64 recurrences written out in
tests/test_linear_recurrences.py.

fla-core (a dev dependency) is a pure-Python package whose package __init__ imports its
Triton kernels, which cannot load without a GPU driver; the naive modules import only
torch and einops, so they are loaded here by file path, never through `import fla`.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest
import torch
import torch.nn.functional as F

from madsl.kernels.gla import gla_chunked
from madsl.kernels.linear_recurrence import decay_chunked, delta_chunked
from madsl.layers.retention import Retention
from madsl.stdlib import primitive

B, H, L, K, V = 2, 3, 37, 8, 6


def _naive(op: str) -> ModuleType:
    spec = importlib.util.find_spec("fla")  # finds the package without running its __init__
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("fla-core is not installed (pip install -e '.[dev]')")
    path = Path(list(spec.submodule_search_locations)[0]) / "ops" / op / "naive.py"
    module_spec = importlib.util.spec_from_file_location(f"fla_naive_{op}", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def _inputs(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, L, d, generator=g) for d in (K, K, V))
    return q, F.normalize(k, dim=-1), v, torch.rand(B, H, L, generator=g), torch.randn(B, H, K, V, generator=g)


def _heads_second(*xs):
    """(B, H, L, ...) -> fla's (B, L, H, ...)."""
    return [x.transpose(1, 2).contiguous() for x in xs]


def _close(got, want, atol=2e-5):
    torch.testing.assert_close(got.float(), want.float(), atol=atol, rtol=1e-4)


def test_gla_matches_fla_naive_recurrent_gla():
    q, k, v, _, state = _inputs()
    gates = F.logsigmoid(torch.randn(B, H, L, K, generator=torch.Generator().manual_seed(1)) + 2)
    o, final = gla_chunked(q.double() * K ** -0.5, k.double(), v.double(), gates.double(), state.double(),
                           chunk_size=16)
    o_ref, final_ref = _naive("gla").naive_recurrent_gla(*_heads_second(q, k, v, gates), initial_state=state,
                                                         output_final_state=True)  # scales q by K^-0.5 itself
    _close(o, o_ref.transpose(1, 2))
    _close(final, final_ref)


def test_delta_rule_matches_fla_delta_rule_recurrence():
    q, k, v, beta, state = _inputs()
    o, final = delta_chunked(q.double() * K ** -0.5, k.double(), v.double(), beta.double(), None, state.double(),
                             chunk_size=16)
    o_ref, final_ref = _naive("delta_rule").delta_rule_recurrence(q, k, v, beta, initial_state=state)
    _close(o, o_ref)
    _close(final, final_ref)


def test_gated_delta_rule_matches_fla_naive_recurrent_gated_delta_rule():
    q, k, v, beta, state = _inputs()
    log_decay = -2 * torch.rand(B, H, L, generator=torch.Generator().manual_seed(2))
    o, final = delta_chunked(q.double(), k.double(), v.double(), beta.double(), log_decay.double(), state.double(),
                             chunk_size=16)
    o_ref, final_ref = _naive("gated_delta_rule").naive_recurrent_gated_delta_rule(
        *_heads_second(q, k, v, beta, log_decay), scale=1.0, initial_state=state, output_final_state=True)
    _close(o, o_ref.transpose(1, 2))
    _close(final, final_ref)


def test_retention_decays_and_form_match_fla_naive_retention():
    """The Ret layer's fixed per-head decays (gamma_h = 1 - 2^(-5-h)) are fla's."""
    q, k, v, _, _ = _inputs()
    layer = Retention(primitive("retention", K * H, heads=H))
    assert layer.key_dim == K
    log_decay = layer.log_gamma.view(1, H, 1).expand(B, H, L)
    o, _ = decay_chunked(q.double() * K ** -0.5, k.double(), v.double(), log_decay, chunk_size=16)
    _close(o, _naive("retention").naive_retention(q, k, v))


@pytest.mark.parametrize("normalize", [False, True])
def test_linear_attention_matches_fla_naive_recurrent_linear_attn(normalize):
    q, k, v, _, _ = _inputs()
    q, k = F.elu(q) + 1, F.elu(k) + 1  # positive features, so the normaliser is well away from 0
    values = torch.cat((v, torch.ones_like(v[..., :1])), dim=-1) if normalize else v  # madsl's normaliser column
    o, _ = decay_chunked(q.double() * K ** -0.5, k.double(), values.double(), None, chunk_size=16)
    if normalize:
        o = o[..., :-1] / o[..., -1:]
    o_ref, _ = _naive("linear_attn").naive_recurrent_linear_attn(*_heads_second(q, k, v), normalize=normalize)
    _close(o, o_ref.transpose(1, 2), atol=1e-4)
