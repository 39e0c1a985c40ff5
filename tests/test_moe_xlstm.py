"""MoE's latent experts and shared-expert gate, and xLSTM-7B's mLSTM layer (issue 41), beyond the
primitive contract (tests/test_contract.py): parameter counts tensor by tensor against the reference
classes, the modules against their reference computations, and each in a `.mad` spec.

The reference counts: each `*_reference` lists the parameter tensors the reference class declares
(its nn.Linear / nn.Parameter shapes, read from its source and cited) for a small config; the sum of
their sizes must equal madsl's `params()` for the matching primitive.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import madsl
from madsl.lang.stdlib import primitive
from madsl.primitives.base import ConfigError

torch.set_num_threads(1)


def _numel(shapes: dict[str, tuple[int, ...]]) -> int:
    return sum(math.prod(shape) for shape in shapes.values())


def _linear(name: str, fan_in: int, fan_out: int, bias: bool = False) -> dict[str, tuple[int, ...]]:
    return {f"{name}.weight": (fan_out, fan_in), **({f"{name}.bias": (fan_out,)} if bias else {})}


# ---- latent MoE (transformers models/nemotron_h/modeling_nemotron_h.py NemotronHMoE, moe_latent_size) ----


def nemotron_h_latent_moe_reference(hidden, experts, width, shared, latent) -> dict:
    """NemotronHMoE: gate (NemotronHTopkRouter: weight (experts, hidden); its e_score_correction_bias is
    a buffer), experts (NemotronHExperts: up_proj (experts, width, latent), down_proj (experts, latent,
    width)), shared_experts (NemotronHMLP at the hidden width, mlp_bias false), fc1_latent_proj and
    fc2_latent_proj (mlp_bias false)."""
    return {
        "gate.weight": (experts, hidden),
        "experts.up_proj": (experts, width, latent),
        "experts.down_proj": (experts, latent, width),
        **_linear("shared_experts.up_proj", hidden, shared),
        **_linear("shared_experts.down_proj", shared, hidden),
        **_linear("fc1_latent_proj", hidden, latent),
        **_linear("fc2_latent_proj", latent, hidden),
    }


def _latent_moe(hidden=64, experts=8, width=24, shared=48, latent=16, active=2):
    config = dict(experts=experts, expert_width=width, active=active, shared_width=shared, latent_width=latent)
    return primitive("moe", hidden, **config, gated=False, activation="relu2")


@pytest.mark.parametrize("experts, width, shared, latent", [(8, 24, 48, 16), (4, 64, 64, 16), (16, 12, 20, 40)])
def test_latent_moe_counts_as_nemotron_h(experts, width, shared, latent):
    prim = _latent_moe(64, experts, width, shared, latent)
    reference = nemotron_h_latent_moe_reference(64, experts, width, shared, latent)
    assert prim.params() == _numel(reference) == sum(p.numel() for p in prim.build().parameters())
    # a token reads the router, both latent projections, the shared expert and its chosen experts
    chosen = 2 * (2 * latent * width)
    assert prim.active_params() == 64 * experts + 2 * 64 * latent + 2 * 64 * shared + chosen


def test_latent_moe_runs_its_experts_in_the_latent_width():
    """out = up(sum_e w_e expert_e(down x)) + shared(x): the router and the shared expert read x."""
    torch.manual_seed(0)
    prim = _latent_moe()
    module = prim.build().double()
    x = torch.randn(3, 5, 64, dtype=torch.float64)
    tokens = x.reshape(-1, 64)
    weights = torch.zeros(tokens.shape[0], 8, dtype=torch.float64)
    top = module.router(tokens).topk(2, dim=-1)
    weights.scatter_(1, top.indices, top.values.softmax(-1))
    latent = module.latent_down(tokens)
    routed = sum(weights[:, e, None] * (F.relu(latent @ module.w_up[e]).square() @ module.w_down[e]) for e in range(8))
    expected = module.latent_up(routed) + module.shared(tokens)
    for dense in (True, False):  # both dispatches
        module.dense_dispatch = dense
        torch.testing.assert_close(module(x).reshape(-1, 64), expected, rtol=1e-10, atol=1e-10)


# ---- shared-expert gate (transformers models/qwen2_moe Qwen2MoeSparseMoeBlock; qwen3_next the same) ----


def qwen3_next_sparse_moe_reference(hidden, experts, width, shared) -> dict:
    """Qwen3NextSparseMoeBlock: gate (router, no bias), experts (gate_up_proj (experts, 2 width, hidden),
    down_proj (experts, hidden, width)), shared_expert (Qwen3NextMLP: gate/up/down, no bias),
    shared_expert_gate Linear(hidden, 1, bias=False)."""
    return {
        "gate.weight": (experts, hidden),
        "experts.gate_up_proj": (experts, 2 * width, hidden),
        "experts.down_proj": (experts, hidden, width),
        **_linear("shared_expert.gate_proj", hidden, shared),
        **_linear("shared_expert.up_proj", hidden, shared),
        **_linear("shared_expert.down_proj", shared, hidden),
        **_linear("shared_expert_gate", hidden, 1),
    }


@pytest.mark.parametrize("experts, width, shared", [(8, 16, 32), (16, 8, 64)])
def test_shared_expert_gate_counts_as_qwen3_next(experts, width, shared):
    prim = primitive("moe", 64, experts=experts, expert_width=width, active=2, shared_width=shared, shared_gate=True)
    assert prim.params() == _numel(qwen3_next_sparse_moe_reference(64, experts, width, shared))
    ungated = primitive("moe", 64, experts=experts, expert_width=width, active=2, shared_width=shared)
    assert prim.params() - ungated.params() == 64 == prim.active_params() - ungated.active_params()
    assert prim.flops(10) - ungated.flops(10) == 2 * 10 * 64


def test_shared_expert_gate_scales_the_shared_expert_by_a_sigmoid():
    torch.manual_seed(0)
    gated = primitive("moe", 32, experts=4, expert_width=8, active=2, shared_width=16, shared_gate=True).build()
    torch.manual_seed(0)
    plain = primitive("moe", 32, experts=4, expert_width=8, active=2, shared_width=16).build()
    x = torch.randn(2, 3, 32)
    with torch.no_grad():
        shared = plain.shared(x)
        expected = plain(x) - shared + torch.sigmoid(gated.shared_gate(x)) * shared
        torch.testing.assert_close(gated(x), expected)


def test_a_shared_expert_gate_needs_a_shared_expert():
    with pytest.raises(ConfigError, match="shared expert"):
        primitive("moe", 32, shared_gate=True)


# ---- xLSTM-7B (transformers models/xlstm/modeling_xlstm.py xLSTMLayer, xLSTMBlock, xLSTMForCausalLM) ----


def xlstm_layer_reference(hidden, heads, qk_factor, v_factor, bias) -> dict:
    """xLSTMLayer, weight_mode "single": q, k (hidden -> int(hidden qk_dim_factor)), v, ogate_preact
    (hidden -> int(hidden v_dim_factor)), all with use_bias; igate_preact, fgate_preact (hidden -> heads,
    with a bias); multihead_norm (weight v_dim, a bias with use_bias); out_proj (v_dim -> hidden)."""
    qk, v = int(hidden * qk_factor), int(hidden * v_factor)
    return {
        **_linear("q", hidden, qk, bias),
        **_linear("k", hidden, qk, bias),
        **_linear("v", hidden, v, bias),
        **_linear("ogate_preact", hidden, v, bias),
        **_linear("igate_preact", hidden, heads, True),
        **_linear("fgate_preact", hidden, heads, True),
        "multihead_norm.weight": (v,),
        **({"multihead_norm.bias": (v,)} if bias else {}),
        **_linear("out_proj", v, hidden, bias),
    }


def xlstm_model_reference(vocab, hidden, blocks, heads, qk_factor, v_factor, ffn_width) -> dict:
    """xLSTMForCausalLM (use_bias false, untied): embeddings, per block norm_mlstm (RMSNorm weight),
    mlstm_layer, norm_ffn, ffn (proj_up_gate, proj_up, proj_down: a SwiGLU), out_norm, lm_head."""
    out = {"embeddings.weight": (vocab, hidden), "out_norm.weight": (hidden,), "lm_head.weight": (vocab, hidden)}
    for b in range(blocks):
        layer = xlstm_layer_reference(hidden, heads, qk_factor, v_factor, False)
        out.update({f"blocks.{b}.mlstm_layer.{k}": v for k, v in layer.items()})
        out[f"blocks.{b}.norm_mlstm.weight"] = (hidden,)
        out[f"blocks.{b}.norm_ffn.weight"] = (hidden,)
        out.update({f"blocks.{b}.ffn.{k}": v for k, v in _linear("proj_up_gate", hidden, ffn_width).items()})
        out.update({f"blocks.{b}.ffn.{k}": v for k, v in _linear("proj_up", hidden, ffn_width).items()})
        out.update({f"blocks.{b}.ffn.{k}": v for k, v in _linear("proj_down", ffn_width, hidden).items()})
    return out


def _xlstm_7b_layer(hidden: int, heads: int, bias: bool = False, qk_factor: float = 0.5, v_factor: float = 1.0):
    qk, v = int(hidden * qk_factor), int(hidden * v_factor)
    config = dict(heads=heads, head_dim=v // heads, qk_head_dim=qk // heads, gate_soft_cap=15.0, bias=bias)
    return primitive("mlstm", hidden, **config, norm_eps=1e-6, zero_stabilizer=True, eps=1e-6)


@pytest.mark.parametrize("hidden, heads, bias", [(64, 4, False), (128, 8, True), (96, 2, False)])
def test_mlstm_with_xlstm_7b_options_counts_as_transformers_xlstm_layer(hidden, heads, bias):
    prim = _xlstm_7b_layer(hidden, heads, bias)
    reference = xlstm_layer_reference(hidden, heads, 0.5, 1.0, bias)
    assert prim.params() == _numel(reference) == sum(p.numel() for p in prim.build().parameters())
    qk_head, v_head = hidden // 2 // heads, hidden // heads
    # transformers' xLSTMCache: C (heads, qk_head_dim, v_head_dim), n (heads, qk_head_dim), m (heads, 1)
    assert prim.fixed_state() == heads * (qk_head * v_head + qk_head + 1)


def _ffn_width(hidden: int, factor: float = 2.667, multiple: int = 64) -> int:
    """transformers' round_up_to_next_multiple_of(hidden * ffn_proj_factor, ffn_round_up_to_multiple_of)."""
    return int(((hidden * factor + multiple - 1) // multiple) * multiple)


def _xlstm_spec(tmp_path, vocab, hidden, blocks, heads):
    qk, v = hidden // 2 // heads, hidden // heads
    layer = (
        f"mL{{heads={heads}, head_dim={v}, qk_head_dim={qk}, gate_soft_cap=15.0, norm_eps=1e-6, "
        f"zero_stabilizer=true, eps=1e-6}}"
    )
    text = (
        f"name: xlstm\ndim: {hidden}\nvocab: {vocab}\ntie_embeddings: false\nnorm: rms\n"
        f"topology: ({layer}-Sg{{inner={_ffn_width(hidden)}}}){'x' + str(blocks) if blocks > 1 else ''}\n"
    )
    path = tmp_path / "xlstm.mad"
    path.write_text(text)
    return madsl.load_spec(path)


@pytest.mark.parametrize(
    "vocab, hidden, blocks, heads",
    [(256, 128, 2, 4), (50304, 4096, 32, 8)],  # a small config; NX-AI/xLSTM-7b's config.json
)
def test_a_spec_of_mlstm_and_swiglu_blocks_counts_as_xlstm_for_causal_lm(tmp_path, vocab, hidden, blocks, heads):
    spec = _xlstm_spec(tmp_path, vocab, hidden, blocks, heads)
    reference = xlstm_model_reference(vocab, hidden, blocks, heads, 0.5, 1.0, _ffn_width(hidden))
    assert madsl.account(spec, vocab=vocab, seq_len=16).totals["params"] == _numel(reference)


def _soft_cap(x, cap):
    return cap * torch.tanh(x / cap)


def xlstm_recurrent_reference(module, x: torch.Tensor) -> torch.Tensor:
    """xLSTM's layer as its native recurrent step computes it (m_0 = 0, C_0 = n_0 = 0): the
    stabilised exponential gates, q scaled by qk_head_dim^-0.5, the normaliser max(|q.n|, exp(-m)) + eps,
    then the per-head LayerNorm, sigmoid output gate and out_proj, written out from its equations."""
    batch, length, _ = x.shape
    heads, qk, hv = module.heads, module.key_dim, module.head_dim
    q = module.q_proj(x).view(batch, length, heads, qk) * qk**-0.5
    k = module.k_proj(x).view(batch, length, heads, qk)
    v = module.v_proj(x).view(batch, length, heads, hv)
    i_pre = _soft_cap(module.igate(x), module.gate_soft_cap)
    f_log = F.logsigmoid(_soft_cap(module.fgate(x), module.gate_soft_cap))
    c = x.new_zeros(batch, heads, qk, hv)
    n = x.new_zeros(batch, heads, qk)
    m = x.new_zeros(batch, heads)
    outputs = []
    for t in range(length):
        m_new = torch.maximum(f_log[:, t] + m, i_pre[:, t])
        f_act, i_act = torch.exp(f_log[:, t] + m - m_new), torch.exp(i_pre[:, t] - m_new)
        c = f_act[..., None, None] * c + i_act[..., None, None] * k[:, t, :, :, None] * v[:, t, :, None, :]
        n = f_act[..., None] * n + i_act[..., None] * k[:, t]
        numerator = torch.einsum("bhk,bhkv->bhv", q[:, t], c)
        denominator = torch.maximum((q[:, t] * n).sum(-1).abs(), torch.exp(-m_new)) + module.eps
        outputs.append(numerator / denominator[..., None])
        m = m_new
    h = torch.stack(outputs, 1)  # (batch, L, heads, hv)
    h = (h - h.mean(-1, keepdim=True)) / torch.sqrt(h.var(-1, unbiased=False, keepdim=True) + module.norm_eps)
    h = h.flatten(-2) * module.norm_weight + (module.norm_bias if module.norm_bias is not None else 0)
    return module.out_proj(torch.sigmoid(module.o_proj(x)) * h)


@pytest.mark.parametrize("bias", [False, True])
def test_mlstm_with_xlstm_7b_options_computes_xlstm_s_recurrence(bias):
    torch.manual_seed(0)
    module = _xlstm_7b_layer(64, 4, bias).build().double()
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in module.parameters():  # off the gates' structured init, with gates large enough to cap
            p.add_(0.3 * torch.randn(p.shape, generator=generator, dtype=p.dtype))
        module.igate.bias.sub_(10.0)  # xLSTM-7B's input-gate init: -10, where the zero start matters
    x = 3 * torch.randn(2, 13, 64, dtype=torch.float64, generator=generator)
    with torch.no_grad():
        torch.testing.assert_close(module(x), xlstm_recurrent_reference(module, x), rtol=1e-10, atol=1e-10)


def test_an_xlstm_spec_compiles_and_prefill_then_step_equals_forward(tmp_path):
    spec = _xlstm_spec(tmp_path, 32, 64, 2, 4)
    model = madsl.compile(spec, vocab_size=32, max_seq_len=12).double().eval()
    assert sum(p.numel() for p in model.parameters()) == madsl.account(spec, vocab=32, seq_len=12).totals["params"]
    tokens = torch.randint(0, 32, (2, 12), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        full = model(tokens)
        logits, state = model.prefill(tokens[:, :7])
        stepped = [logits]
        for t in range(7, 12):
            step_logits, state = model.step(tokens[:, t], state)
            stepped.append(step_logits[:, None])
    torch.testing.assert_close(torch.cat(stepped, 1), full, rtol=1e-8, atol=1e-8)


def test_a_spec_with_latent_and_gated_shared_experts_trains_a_step(tmp_path):
    path = tmp_path / "moe.mad"
    path.write_text(
        "name: moe-2026\ndim: 32\ntopology: A-MoE{experts=4, expert_width=8, shared_width=16, latent_width=8, "
        "gated=false, activation=relu2}:A-MoE{experts=4, expert_width=8, shared_width=16, shared_gate=true}\n"
    )
    spec = madsl.load_spec(path)
    model = madsl.compile(spec, vocab_size=16, max_seq_len=12)
    assert sum(p.numel() for p in model.parameters()) == madsl.account(spec, vocab=16, seq_len=12).totals["params"]
    tokens = torch.randint(0, 16, (2, 12), generator=torch.Generator().manual_seed(5))
    loss = F.cross_entropy(model(tokens)[:, :-1].flatten(0, 1), tokens[:, 1:].flatten())
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_the_language_reference_states_xlstm_7b_s_count(tmp_path):
    """docs/language.md's xLSTM-7B total is the accounting's of the spec it writes out."""
    from pathlib import Path

    text = " ".join((Path(__file__).parent.parent / "docs/language.md").read_text().split())
    total = madsl.account(_xlstm_spec(tmp_path, 50304, 4096, 32, 8), vocab=50304).totals["params"]
    assert f"{total:,} parameters, transformers' `xLSTMForCausalLM` to the unit" in text
    assert "`mL{heads=8, head_dim=512, qk_head_dim=256, gate_soft_cap=15.0, norm_eps=1e-6, " in text
    assert f"-Sg{{inner={_ffn_width(4096)}}}`" in text
