"""The layers of the 2025-26 hybrids (issue 41) beyond the primitive contract (tests/test_contract.py):
parameter counts against the reference classes, the chunked kernels against their recurrences over
several chunks, and each layer in a `.mad` spec trained a step on the CPU.

The reference counts: each `*_reference` lists the parameter tensors the reference class declares
(its nn.Linear / nn.Conv1d / nn.Parameter shapes, read from its source and cited), for a small
config; the sum of their sizes must equal madsl's `params()` for the matching primitive.
"""

from __future__ import annotations

import math

import pytest
import torch

import madsl
from madsl.kernels.channel_delta import channel_delta_chunked, channel_delta_step
from madsl.kernels.dplr import dplr_chunked, dplr_step
from madsl.lang.stdlib import primitive
from madsl.layers.rglru import diagonal_scan

torch.set_num_threads(1)


def _numel(shapes: dict[str, tuple[int, ...]]) -> int:
    return sum(math.prod(shape) for shape in shapes.values())


def _linear(name: str, fan_in: int, fan_out: int, bias: bool = False) -> dict[str, tuple[int, ...]]:
    return {f"{name}.weight": (fan_out, fan_in), **({f"{name}.bias": (fan_out,)} if bias else {})}


# ---- Qwen3-Next (transformers models/qwen3_next/modeling_qwen3_next.py) --------------------------------


def qwen3_next_gated_delta_net_reference(hidden, k_heads, v_heads, k_dim, v_dim, conv) -> dict:
    """Qwen3NextGatedDeltaNet: in_proj_qkvz, in_proj_ba, conv1d (no bias), dt_bias, A_log, the gated
    RMSNorm over head_v_dim, out_proj."""
    key, value = k_heads * k_dim, v_heads * v_dim
    conv_dim = 2 * key + value
    return {
        **_linear("in_proj_qkvz", hidden, 2 * key + 2 * value),
        **_linear("in_proj_ba", hidden, 2 * v_heads),
        "conv1d.weight": (conv_dim, 1, conv),
        "dt_bias": (v_heads,),
        "A_log": (v_heads,),
        "norm.weight": (v_dim,),
        **_linear("out_proj", value, hidden),
    }


def qwen3_next_attention_reference(hidden, heads, kv_heads, head_dim, bias) -> dict:
    """Qwen3NextAttention: q_proj doubled (query and gate), k_proj, v_proj, o_proj, q_norm, k_norm."""
    return {
        **_linear("q_proj", hidden, 2 * heads * head_dim, bias),
        **_linear("k_proj", hidden, kv_heads * head_dim, bias),
        **_linear("v_proj", hidden, kv_heads * head_dim, bias),
        **_linear("o_proj", heads * head_dim, hidden, bias),
        "q_norm.weight": (head_dim,),
        "k_norm.weight": (head_dim,),
    }


@pytest.mark.parametrize("k_heads, v_heads, k_dim, expand_v", [(2, 4, 16, 1), (2, 6, 8, 2), (4, 4, 16, 1)])
def test_gated_delta_net_with_more_value_heads_counts_as_qwen3_next(k_heads, v_heads, k_dim, expand_v):
    prim = primitive("delta_net", 64, heads=k_heads, head_dim=k_dim, expand_v=expand_v, value_heads=v_heads, d_conv=4)
    reference = qwen3_next_gated_delta_net_reference(64, k_heads, v_heads, k_dim, expand_v * k_dim, 4)
    assert prim.params() == _numel(reference) == sum(p.numel() for p in prim.build().parameters())
    assert prim.fixed_state() == v_heads * k_dim * expand_v * k_dim


@pytest.mark.parametrize("kv_heads, bias", [(2, False), (4, True)])
def test_gated_attention_counts_as_qwen3_next(kv_heads, bias):
    prim = primitive(
        "attention", 64, heads=4, head_dim=16, kv_heads=kv_heads, qk_norm=True, output_gate=True, bias=bias
    )
    reference = qwen3_next_attention_reference(64, 4, kv_heads, 16, bias)
    assert prim.params() == _numel(reference)
    # the gate doubles q_proj: exactly dim x heads x head_dim (+ its bias) over the ungated layer
    ungated = primitive("attention", 64, heads=4, head_dim=16, kv_heads=kv_heads, qk_norm=True, bias=bias)
    assert prim.params() - ungated.params() == 64 * 64 + (64 if bias else 0)


# ---- MLA (transformers models/deepseek_v3/modeling_deepseek_v3.py DeepseekV3Attention; Kimi Linear's) ----


def deepseek_v3_attention_reference(hidden, heads, q_lora, kv_lora, nope, rope, v_dim, bias) -> dict:
    """DeepseekV3Attention: q_proj (q_lora_rank None) or q_a_proj, q_a_layernorm, q_b_proj;
    kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj (biases: attention_bias)."""
    query = (
        _linear("q_proj", hidden, heads * (nope + rope))
        if q_lora is None
        else {
            **_linear("q_a_proj", hidden, q_lora, bias),
            "q_a_layernorm.weight": (q_lora,),
            **_linear("q_b_proj", q_lora, heads * (nope + rope)),
        }
    )
    return {
        **query,
        **_linear("kv_a_proj_with_mqa", hidden, kv_lora + rope, bias),
        "kv_a_layernorm.weight": (kv_lora,),
        **_linear("kv_b_proj", kv_lora, heads * (nope + v_dim)),
        **_linear("o_proj", heads * v_dim, hidden, bias),
    }


@pytest.mark.parametrize(
    "q_lora, kv_lora, nope, rope, v_dim, bias, rotary",
    [(None, 32, 16, 8, 16, False, True), (24, 32, 16, 8, 12, True, True), (None, 48, 12, 8, 12, False, False)],
)
def test_mla_counts_as_deepseek_v3_and_caches_the_latent(q_lora, kv_lora, nope, rope, v_dim, bias, rotary):
    config = dict(heads=4, q_lora_rank=q_lora, kv_lora_rank=kv_lora, qk_nope_head_dim=nope, qk_rope_head_dim=rope)
    prim = primitive("mla", 64, **config, v_head_dim=v_dim, bias=bias, rotary=rotary)
    assert prim.params() == _numel(deepseek_v3_attention_reference(64, 4, q_lora, kv_lora, nope, rope, v_dim, bias))
    assert prim.kv_cache(100) == 100 * (kv_lora + rope)  # the latent and the shared rotary key per token


# ---- KDA (transformers models/kimi_linear KimiLinearDeltaAttention; fla layers/kda.py KimiDeltaAttention) --


def kimi_linear_delta_attention_reference(hidden, heads, head_dim, conv) -> dict:
    """transformers' KimiLinearDeltaAttention (values as wide and as many as keys, as Kimi's config):
    q/k/v_proj, one packed conv1d (no bias), forget_gate_down/up, beta_proj, A_log (heads, 1),
    dt_bias (heads, head_dim), output_gate_down/up (no bias), o_norm, o_proj."""
    width = heads * head_dim
    return {
        **_linear("q_proj", hidden, width),
        **_linear("k_proj", hidden, width),
        **_linear("v_proj", hidden, width),
        "conv1d.weight": (3 * width, 1, conv),
        **_linear("forget_gate_down", hidden, head_dim),
        **_linear("forget_gate_up", head_dim, width),
        **_linear("beta_proj", hidden, heads),
        "A_log": (heads, 1),
        "dt_bias": (heads, head_dim),
        **_linear("output_gate_down", hidden, head_dim),
        **_linear("output_gate_up", head_dim, width),
        "o_norm.weight": (head_dim,),
        **_linear("o_proj", width, hidden),
    }


def fla_kimi_delta_attention_reference(hidden, heads, v_heads, head_dim, expand_v, conv) -> dict:
    """fla's KimiDeltaAttention: q/k/v_proj, three ShortConvolutions (no bias), f_proj (hidden ->
    head_v_dim -> v_heads*head_dim), b_proj, A_log (v_heads), dt_bias (v_heads*head_dim), g_proj
    (hidden -> head_v_dim -> value_dim, with a bias), o_norm, o_proj."""
    key, head_v = heads * head_dim, head_dim * expand_v
    value = v_heads * head_v
    return {
        **_linear("q_proj", hidden, key),
        **_linear("k_proj", hidden, key),
        **_linear("v_proj", hidden, value),
        "q_conv1d.weight": (key, 1, conv),
        "k_conv1d.weight": (key, 1, conv),
        "v_conv1d.weight": (value, 1, conv),
        **_linear("f_proj.0", hidden, head_v),
        **_linear("f_proj.1", head_v, v_heads * head_dim),
        **_linear("b_proj", hidden, v_heads),
        "A_log": (v_heads,),
        "dt_bias": (v_heads * head_dim,),
        **_linear("g_proj.0", hidden, head_v),
        **_linear("g_proj.1", head_v, value, bias=True),
        "o_norm.weight": (head_v,),
        **_linear("o_proj", value, hidden),
    }


@pytest.mark.parametrize("heads, head_dim", [(4, 16), (2, 24)])
def test_kda_counts_as_transformers_kimi_linear(heads, head_dim):
    prim = primitive("kda", 64, heads=heads, head_dim=head_dim, d_conv=4)
    assert prim.params() == _numel(kimi_linear_delta_attention_reference(64, heads, head_dim, 4))
    assert prim.fixed_state() == heads * head_dim * head_dim


@pytest.mark.parametrize("heads, v_heads, head_dim, expand_v", [(4, 4, 16, 1), (2, 4, 16, 2)])
def test_kda_with_gate_bias_counts_as_fla(heads, v_heads, head_dim, expand_v):
    config = dict(heads=heads, value_heads=v_heads, head_dim=head_dim, expand_v=expand_v, d_conv=4, gate_bias=True)
    prim = primitive("kda", 64, **config)
    assert prim.params() == _numel(fla_kimi_delta_attention_reference(64, heads, v_heads, head_dim, expand_v, 4))


# ---- RG-LRU (transformers models/recurrent_gemma RecurrentGemmaRecurrentBlock, RecurrentGemmaRglru) ----


def recurrent_gemma_recurrent_block_reference(hidden, lru_width, heads, conv) -> dict:
    block = lru_width // heads
    return {
        **_linear("linear_y", hidden, lru_width, bias=True),
        **_linear("linear_x", hidden, lru_width, bias=True),
        **_linear("linear_out", lru_width, hidden, bias=True),
        "conv_1d.weight": (lru_width, 1, conv),
        "conv_1d.bias": (lru_width,),
        "rg_lru.recurrent_param": (lru_width,),
        "rg_lru.input_gate_weight": (heads, block, block),
        "rg_lru.input_gate_bias": (heads, block),
        "rg_lru.recurrent_gate_weight": (heads, block, block),
        "rg_lru.recurrent_gate_bias": (heads, block),
    }


@pytest.mark.parametrize("width, heads", [(64, 4), (96, 8)])
def test_rglru_counts_as_recurrent_gemma(width, heads):
    prim = primitive("rglru", 64, width=width, heads=heads, d_conv=4)
    assert prim.params() == _numel(recurrent_gemma_recurrent_block_reference(64, width, heads, 4))
    assert (prim.fixed_state(), prim.conv_state()) == (width, 3 * width)


# ---- lightning attention (transformers models/minimax MiniMaxLightningAttention) -----------------------


def minimax_lightning_attention_reference(hidden, heads, head_dim) -> dict:
    inner = heads * head_dim
    return {
        **_linear("qkv_proj", hidden, 3 * inner),
        **_linear("output_gate", hidden, inner),
        **_linear("out_proj", inner, hidden),
        "norm.weight": (inner,),
    }


@pytest.mark.parametrize("heads, head_dim", [(4, 16), (8, 12)])
def test_lightning_counts_as_minimax(heads, head_dim):
    prim = primitive("lightning", 64, heads=heads, head_dim=head_dim)
    assert prim.params() == _numel(minimax_lightning_attention_reference(64, heads, head_dim))


def test_lightning_slopes_are_minimax_s():
    """MiniMax's get_slope_rate: (1 / 2^(8 / H))^(h + 1), times the layer's factor."""
    prim = primitive("lightning", 64, heads=8, decay_scale=0.5)
    expected = [(1 / 2 ** (8 / 8)) ** (h + 1) * 0.5 for h in range(8)]
    assert prim.slopes() == pytest.approx(expected, rel=1e-12)


# ---- RWKV-7 (flash-linear-attention fla/layers/rwkv7.py RWKV7Attention, layer_idx 0) ---------------------


def fla_rwkv7_attention_reference(hidden, head_dim, decay_rank, a_rank, gate_rank) -> dict:
    """RWKV7Attention of a first layer (no v_lora): the six mixes, k_k, k_a, r_k, r/k/v/o_proj, the
    LoRAs (fla's LoRA: Linear without bias, activation, Linear with a bias unless bias=False), g_norm."""
    heads = hidden // head_dim
    mixes = {f"x_{c}": (1, 1, hidden) for c in "rwkvag"}
    return {
        **mixes,
        "k_k": (hidden,),
        "k_a": (hidden,),
        "r_k": (heads, head_dim),
        **{k: v for name in ("r_proj", "k_proj", "v_proj", "o_proj") for k, v in _linear(name, hidden, hidden).items()},
        **_linear("w_lora.lora.0", hidden, decay_rank),
        **_linear("w_lora.lora.2", decay_rank, hidden, bias=True),
        **_linear("a_lora.lora.0", hidden, a_rank),
        **_linear("a_lora.lora.2", a_rank, hidden, bias=True),
        **_linear("g_lora.lora.0", hidden, gate_rank),
        **_linear("g_lora.lora.2", gate_rank, hidden),
        "g_norm.weight": (hidden,),
        "g_norm.bias": (hidden,),
    }


@pytest.mark.parametrize("heads, ranks", [(2, (32, 32, 64)), (4, (16, 24, 32))])
def test_rwkv7_counts_as_fla_first_layer(heads, ranks):
    decay_rank, a_rank, gate_rank = ranks
    prim = primitive("rwkv7", 128, heads=heads, decay_rank=decay_rank, a_rank=a_rank, gate_rank=gate_rank)
    assert prim.params() == _numel(fla_rwkv7_attention_reference(128, 128 // heads, *ranks))
    assert (prim.fixed_state(), prim.conv_state()) == (128 * 128 // heads, 128)


def test_rwkv7_default_ranks_follow_fla_s_rule_at_the_mad_width():
    """fla's defaults for hidden_size 128, head_dim 64: decay and a max(32, round(2.5 sqrt(D) / 32) 32) = 32,
    gate max(32, round(5 sqrt(D) / 32) 32) = 64."""
    prim = primitive("rwkv7", 128)
    assert prim.head_dim == 64
    assert (prim.decay_rank, prim.a_rank) == (max(32, round(2.5 * 128**0.5 / 32) * 32),) * 2
    assert prim.gate_rank == max(32, round(5 * 128**0.5 / 32) * 32)


# ---- the kernels over several chunks -------------------------------------------------------------------


def test_channel_delta_chunked_equals_its_recurrence_over_several_chunks():
    generator = torch.Generator().manual_seed(3)
    batch, heads, length, key_dim, value_dim = 2, 3, 41, 5, 4

    def rand(*shape):
        return torch.randn(*shape, dtype=torch.float64, generator=generator)

    q = rand(batch, heads, length, key_dim)
    k = torch.nn.functional.normalize(rand(batch, heads, length, key_dim), dim=-1)
    v = rand(batch, heads, length, value_dim)
    beta = torch.rand(batch, heads, length, dtype=torch.float64, generator=generator)
    log_decay = -5 * torch.rand(batch, heads, length, key_dim, dtype=torch.float64, generator=generator)  # strong
    initial = rand(batch, heads, key_dim, value_dim)
    out, final = channel_delta_chunked(q, k, v, beta, log_decay, initial_state=initial, chunk_size=8)
    state, outputs = initial, []
    for t in range(length):
        o_t, state = channel_delta_step(q[:, :, t], k[:, :, t], v[:, :, t], beta[:, :, t], log_decay[:, :, t], state)
        outputs.append(o_t)
    torch.testing.assert_close(out, torch.stack(outputs, 2), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(final, state, rtol=1e-10, atol=1e-10)


def test_dplr_chunked_equals_its_recurrence_over_several_chunks():
    generator = torch.Generator().manual_seed(6)
    shape, value_shape = (2, 3, 37, 5), (2, 3, 37, 4)

    def rand(*size):
        return torch.randn(*size, dtype=torch.float64, generator=generator)

    r, k, v = rand(*shape), rand(*shape), rand(*value_shape)
    kk = torch.nn.functional.normalize(rand(*shape), dim=-1)
    a_gate = torch.rand(*shape, dtype=torch.float64, generator=generator)
    log_w = -3 * torch.rand(*shape, dtype=torch.float64, generator=generator)
    initial = rand(2, 3, 5, 4)
    out, final = dplr_chunked(r, log_w, k, v, -kk, kk * a_gate, initial_state=initial, chunk_size=8)
    state, outputs = initial, []
    for t in range(37):
        o_t, state = dplr_step(
            r[:, :, t], log_w[:, :, t], k[:, :, t], v[:, :, t], -kk[:, :, t], (kk * a_gate)[:, :, t], state
        )
        outputs.append(o_t)
    torch.testing.assert_close(out, torch.stack(outputs, 2), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(final, state, rtol=1e-10, atol=1e-10)


def test_diagonal_scan_equals_the_loop():
    generator = torch.Generator().manual_seed(4)
    a = torch.rand(2, 37, 5, dtype=torch.float64, generator=generator)
    x = torch.randn(2, 37, 5, dtype=torch.float64, generator=generator)
    h, expected = torch.zeros(2, 5, dtype=torch.float64), []
    for t in range(37):
        h = a[:, t] * h + x[:, t]
        expected.append(h)
    torch.testing.assert_close(diagonal_scan(a, x), torch.stack(expected, 1), rtol=1e-12, atol=1e-12)


# ---- usable in a spec like any other layer --------------------------------------------------------------

SPEC = """\
name: hybrid-2025
dim: 32
topology: GDN{value_heads=8}-Sg:A{heads=4, kv_heads=2, output_gate=true}-Sg:MLA-Sg:KDA-Sg:RG-Sg:Lt-Sg:R7-Sg
layers:
  MLA: {primitive: mla, heads: 2, kv_lora_rank: 16, qk_nope_head_dim: 8, qk_rope_head_dim: 4, v_head_dim: 8}
"""


def test_a_spec_with_every_new_layer_accounts_compiles_and_trains_a_step(tmp_path):
    path = tmp_path / "hybrid.mad"
    path.write_text(SPEC)
    spec = madsl.load_spec(path)
    account = madsl.account(spec, vocab=16, seq_len=12)
    model = madsl.compile(spec, vocab_size=16, max_seq_len=12)
    assert sum(p.numel() for p in model.parameters()) == account.totals["params"]
    assert account.totals["kv_cache"] > 0 and account.totals["fixed_state"] > 0
    tokens = torch.randint(0, 16, (2, 12), generator=torch.Generator().manual_seed(5))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    before = [p.detach().clone() for p in model.parameters()]
    logits = model(tokens)
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten())
    loss.backward()
    optimizer.step()
    assert torch.isfinite(loss)
    assert all(not torch.equal(b, p) for b, p in zip(before, model.parameters()) if p.grad is not None)
    # prefill, then one step per token, equals the parallel forward
    model = model.double().eval()
    with torch.no_grad():
        full = model(tokens)
        logits, state = model.prefill(tokens[:, :7])
        stepped = [logits]
        for t in range(7, 12):
            step_logits, state = model.step(tokens[:, t], state)
            stepped.append(step_logits[:, None])
    torch.testing.assert_close(torch.cat(stepped, 1), full, rtol=1e-8, atol=1e-8)


def test_the_language_reference_states_these_layers_sizes():
    """docs/language.md's numbers for the new layers are the accounting's at width 128."""
    from pathlib import Path

    text = " ".join((Path(__file__).parent.parent / "docs/language.md").read_text().split())
    stated = {
        "states": (primitive("delta_net", 128, value_heads=8).fixed_state(), "8 value heads: {:,} states"),
        "mla": (primitive("mla", 128).kv_cache(1), "(144 at the defaults, where multi-head attention"),
        "mha": (2 * 4 * 32, "of the same heads would cache {}"),
        "kda": (primitive("kda", 128).fixed_state(), "value_heads · head_dim · value_dim ({:,} at the defaults)"),
        "lt": (primitive("lightning", 128).fixed_state(), "heads · head_dim² ({:,} at the defaults)"),
        "r7": (primitive("rwkv7", 128).fixed_state(), "dim · head_dim ({:,} at the defaults)"),
    }
    for name, (value, phrase) in stated.items():
        assert phrase.format(value) in text, (name, phrase.format(value))
    assert primitive("mla", 128).kv_cache(1) == 144
