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
from madsl.lang.stdlib import primitive
from madsl.layers.retention import Retention

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
    o, final = gla_chunked(q.double() * K**-0.5, k.double(), v.double(), gates.double(), state.double(), chunk_size=16)
    o_ref, final_ref = _naive("gla").naive_recurrent_gla(
        *_heads_second(q, k, v, gates), initial_state=state, output_final_state=True
    )  # scales q by K^-0.5 itself
    _close(o, o_ref.transpose(1, 2))
    _close(final, final_ref)


def test_delta_rule_matches_fla_delta_rule_recurrence():
    q, k, v, beta, state = _inputs()
    o, final = delta_chunked(
        q.double() * K**-0.5, k.double(), v.double(), beta.double(), None, state.double(), chunk_size=16
    )
    o_ref, final_ref = _naive("delta_rule").delta_rule_recurrence(q, k, v, beta, initial_state=state)
    _close(o, o_ref)
    _close(final, final_ref)


def test_gated_delta_rule_matches_fla_naive_recurrent_gated_delta_rule():
    q, k, v, beta, state = _inputs()
    log_decay = -2 * torch.rand(B, H, L, generator=torch.Generator().manual_seed(2))
    o, final = delta_chunked(
        q.double(), k.double(), v.double(), beta.double(), log_decay.double(), state.double(), chunk_size=16
    )
    o_ref, final_ref = _naive("gated_delta_rule").naive_recurrent_gated_delta_rule(
        *_heads_second(q, k, v, beta, log_decay), scale=1.0, initial_state=state, output_final_state=True
    )
    _close(o, o_ref.transpose(1, 2))
    _close(final, final_ref)


def test_retention_decays_and_form_match_fla_naive_retention():
    """The Ret layer's fixed per-head decays (gamma_h = 1 - 2^(-5-h)) are fla's."""
    q, k, v, _, _ = _inputs()
    layer = Retention(primitive("retention", K * H, heads=H))
    assert layer.key_dim == K
    log_decay = layer.log_gamma.view(1, H, 1).expand(B, H, L)
    o, _ = decay_chunked(q.double() * K**-0.5, k.double(), v.double(), log_decay, chunk_size=16)
    _close(o, _naive("retention").naive_retention(q, k, v))


@pytest.mark.parametrize("normalize", [False, True])
def test_linear_attention_matches_fla_naive_recurrent_linear_attn(normalize):
    q, k, v, _, _ = _inputs()
    q, k = F.elu(q) + 1, F.elu(k) + 1  # positive features, so the normaliser is well away from 0
    values = torch.cat((v, torch.ones_like(v[..., :1])), dim=-1) if normalize else v  # madsl's normaliser column
    o, _ = decay_chunked(q.double() * K**-0.5, k.double(), values.double(), None, chunk_size=16)
    if normalize:
        o = o[..., :-1] / o[..., -1:]
    o_ref, _ = _naive("linear_attn").naive_recurrent_linear_attn(*_heads_second(q, k, v), normalize=normalize)
    _close(o, o_ref.transpose(1, 2), atol=1e-4)


# --- the CUDA dispatch, through stand-ins with fla's kernel signatures ----------------------------
# The layers call fla's Triton kernels on CUDA (`decay_parallel`, `delta_parallel`). Their layout,
# argument order and scale are checked here on the CPU: each stand-in has the real kernel's
# signature (fla-core 0.6.0's sources) and computes with fla's own naive reference.
def _stand_ins(calls: list[str]) -> dict[tuple[str, str], object]:
    simple_gla = _naive("simple_gla")
    gated = _naive("gated_delta_rule")

    def chunk_simple_gla(
        q,
        k,
        v,
        g=None,
        g_gamma=None,
        scale=None,
        initial_state=None,
        output_final_state=False,
        state_v_first=False,
        cu_seqlens=None,
        cu_seqlens_cpu=None,
        **kwargs,
    ):
        calls.append("chunk_simple_gla")
        assert q.dim() == 4 and g_gamma is None and (g is None or g.shape == q.shape[:3])
        g = torch.zeros(q.shape[:3]) if g is None else g
        return simple_gla.naive_recurrent_simple_gla(
            q, k, v, g, scale=scale, initial_state=initial_state, output_final_state=output_final_state
        )

    def chunk_gated_delta_rule(
        q,
        k,
        v,
        g,
        beta,
        scale=None,
        initial_state=None,
        output_final_state=False,
        use_qk_l2norm_in_kernel=False,
        **kwargs,
    ):
        calls.append("chunk_gated_delta_rule")
        assert g.shape == beta.shape == q.shape[:3]
        return gated.naive_recurrent_gated_delta_rule(
            q, k, v, beta, g, scale=scale, initial_state=initial_state, output_final_state=output_final_state
        )

    def chunk_delta_rule(
        q,
        k,
        v,
        beta,
        scale=None,
        initial_state=None,
        output_final_state=False,
        use_qk_l2norm_in_kernel=False,
        cu_seqlens=None,
        cu_seqlens_cpu=None,
        **kwargs,
    ):
        calls.append("chunk_delta_rule")
        assert beta.shape == q.shape[:3]
        return gated.naive_recurrent_gated_delta_rule(
            q,
            k,
            v,
            beta,
            torch.zeros_like(beta),
            scale=scale,
            initial_state=initial_state,
            output_final_state=output_final_state,
        )

    return {
        ("fla.ops.simple_gla", "chunk_simple_gla"): chunk_simple_gla,
        ("fla.ops.gated_delta_rule", "chunk_gated_delta_rule"): chunk_gated_delta_rule,
        ("fla.ops.delta_rule", "chunk_delta_rule"): chunk_delta_rule,
    }


@pytest.mark.parametrize(
    "name, params, kernel",
    [
        ("mamba2", {"d_state": 8}, "chunk_simple_gla"),
        ("retention", {}, "chunk_simple_gla"),
        ("linear_attention", {"normalize": True}, "chunk_simple_gla"),
        ("delta_net", {"gated": True}, "chunk_gated_delta_rule"),
        # fla's chunk_delta_rule refuses float32, so ungated float32 takes the gated kernel with no decay
        # (the ungated kernel's layout in 16 bits: tests/test_fla_interpreted.py, with fla's real kernel)
        ("delta_net", {"gated": False}, "chunk_gated_delta_rule"),
    ],
)
def test_layers_call_flas_kernels_with_their_layout_and_scale(monkeypatch, name, params, kernel):
    from madsl.kernels import cuda, linear_recurrence

    torch.manual_seed(0)
    layer = primitive(name, 64, **params).build()
    x = torch.randn(2, 45, 64)
    with torch.no_grad():
        want = layer(x)  # the chunked form
        calls: list[str] = []
        stand_ins = _stand_ins(calls)
        monkeypatch.setattr(linear_recurrence, "_fla_applies", lambda q: q.dtype != torch.float64)
        monkeypatch.setattr(cuda, "_fla_op", lambda module, op: stand_ins[(module, op)])
        got = layer(x)
    assert calls == [kernel]  # selected, once per forward
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)
