"""Zamba2's shared block as a madsl primitive (`Zs`, madsl/primitives/zamba.py, madsl/layers/zamba.py).

One use of Zs equals transformers' Zamba2AttentionDecoderLayer (with the adapters of the use's slot) followed
by Zamba2HybridLayer's `linear`, built from a tiny Zamba2Config with every weight (norms included) random and
copied: with and without the q/k/v adapters, with rotary embeddings (positions from 0), grouped keys, biases
and SiLU; through the parallel forward and through prefill + step; float64. transformers' RMSNorm computes in
float32 (`hidden_states.to(torch.float32)`), whatever the input: the comparison runs it in float64 (the same
formula, `float64_norms`), where the two agree to TOLERANCE = 1e-10 (measured: the forward bit for bit, prefill
+ step within 2e-13); transformers as it is agrees to float32's rounding of the normalised input (relative
RELATIVE = 1e-6; measured 4e-7). A wrong slot, a missing rotation or another GELU moves the output by far more.
Two uses made by `another_use` share the core's tensors (the same objects) and not their own parts, whose
size is `per_use_params`; a GQA + rotary + adapters setting, which the generated settings of
tests/test_contract.py do not reach, passes the contract's parameter, FLOP and state checks here.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from test_contract import flop_contract_error
from transformers import Zamba2Config
from transformers.models.zamba2.modeling_zamba2 import Zamba2AttentionDecoderLayer, Zamba2RMSNorm

from madsl.lang.stdlib import primitives
from madsl.layers.zamba import ACTIVATIONS, EmbeddingLink, ZambaShared
from madsl.primitives.base import ConfigError
from madsl.primitives.zamba import ZambaShared as ZambaSharedPrimitive

torch.set_num_threads(1)

DIM, LENGTH, BATCH, PROMPT = 32, 9, 2, 4
TOLERANCE = 1e-10  # float64 throughout (float64_norms)
RELATIVE = 1e-6  # transformers' RMSNorm as it is: the normalised input rounded to float32
HYBRID = ["hybrid", "mamba", "hybrid"]  # two uses of one block (num_mem_blocks 1): adapter slots 0 and 1
f64 = torch.float64

SETTINGS = {
    "plain": {},
    "qkv_adapters": {"qkv_adapters": True},
    "rope": {"rope": True, "qkv_adapters": True},
    "gqa": {"kv_heads": 2, "rope": True},  # transformers' k/v adapters are 2D wide: no adapters with GQA
    "bias_silu": {"bias": True, "activation": "silu", "heads": 2},
}


@pytest.fixture
def float64_norms(monkeypatch):
    """transformers' Zamba2RMSNorm, its formula in the input's dtype (it casts to float32 and back)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))

    monkeypatch.setattr(Zamba2RMSNorm, "forward", forward)


def primitive(**overrides) -> ZambaSharedPrimitive:
    entry = primitives()["zamba_shared"]
    defaults = {**entry.defaults, "ffn": 48, "adapter_rank": 4}
    return entry.cls.create(DIM, {**defaults, **overrides})


def reference(p: ZambaSharedPrimitive) -> tuple[Zamba2AttentionDecoderLayer, list[torch.nn.Linear], Zamba2Config]:
    """transformers' shared block (random weights, norms included) and the two uses' `linear`s."""
    config = Zamba2Config(
        hidden_size=p.dim,
        num_hidden_layers=len(HYBRID),
        layers_block_type=HYBRID,
        num_attention_heads=p.heads,
        num_key_value_heads=p.key_value_heads,
        intermediate_size=p.ffn,
        adapter_rank=p.adapter_rank,
        use_shared_attention_adapter=p.qkv_adapters,
        use_mem_rope=p.rope,
        rope_parameters={"rope_type": "default", "rope_theta": p.rope_theta},
        hidden_act={"gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh", "silu": "silu"}[p.activation],
        add_bias_linear=p.bias,
        rms_norm_eps=p.norm_eps,
        n_mamba_heads=8,
        vocab_size=50,
    )
    config._attn_implementation = "sdpa"
    assert config.attention_head_dim == p.inner_head_dim
    torch.manual_seed(0)
    block = Zamba2AttentionDecoderLayer(config, block_id=0).to(f64)
    linears = [torch.nn.Linear(p.dim, p.dim, bias=False).to(f64) for _ in config.hybrid_layer_ids]
    with torch.no_grad():
        for module in (block, *linears):
            for name, tensor in module.named_parameters():
                tensor.copy_((1.0 if "norm" in name else 0.0) + 0.3 * torch.randn_like(tensor))
    return block, linears, config


def _copy(target: torch.nn.Module, source: torch.nn.Module) -> None:
    with torch.no_grad():
        for (name, t), (other, s) in zip(target.named_parameters(), source.named_parameters(), strict=True):
            assert t.shape == s.shape, (name, other)
            t.copy_(s)


def madsl_uses(p: ZambaSharedPrimitive, block, linears) -> list[ZambaShared]:
    """The two uses of the block in madsl, their weights copied from transformers' (slot i: use i)."""
    first = p.build().to(f64)
    uses = [first, first.another_use().to(f64)]
    core, attn, mlp = first.shared, block.self_attn, block.feed_forward
    pairs = [
        (core.input_norm, block.input_layernorm),
        (core.q_proj, attn.q_proj),
        (core.k_proj, attn.k_proj),
        (core.v_proj, attn.v_proj),
        (core.o_proj, attn.o_proj),
        (core.pre_ff_norm, block.pre_ff_layernorm),
        (core.gate_up, mlp.gate_up_proj),
        (core.down, mlp.down_proj),
    ]
    for slot, use in enumerate(uses):
        pairs += [(use.out, linears[slot]), (use.gate_up_adapter, mlp.gate_up_proj_adapter_list[slot])]
        if p.qkv_adapters:
            pairs += [
                (use.q_adapter, attn.linear_q_adapter_list[slot]),
                (use.k_adapter, attn.linear_k_adapter_list[slot]),
                (use.v_adapter, attn.linear_v_adapter_list[slot]),
            ]
    for mine, theirs in pairs:
        _copy(mine, theirs)
    return uses


def transformers_use(block, linears, config, slot: int, h: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """z of hybrid layer `slot`: the shared block with that slot's adapters, then its linear. Rotary tables
    computed in float64 by Zamba2RotaryEmbedding's formula (the model-level module computes them in float32)."""
    position_embeddings = None
    if config.use_mem_rope:
        hd, theta = config.attention_head_dim, config.rope_parameters["rope_theta"]
        inv_freq = 1.0 / theta ** (torch.arange(0, hd, 2, dtype=f64) / hd)
        angles = torch.arange(h.shape[1], dtype=f64)[:, None] * inv_freq
        angles = torch.cat((angles, angles), dim=-1)[None]
        position_embeddings = (angles.cos(), angles.sin())
    layer_idx = config.hybrid_layer_ids[slot]
    with torch.no_grad():
        out = block(h, original_hidden_states=e, layer_idx=layer_idx, position_embeddings=position_embeddings)
        return linears[slot](out)


def run(use: ZambaShared, h: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    use.embeddings = EmbeddingLink()
    use.embeddings.value = e
    with torch.no_grad():
        return use(h)


def prefill_and_step(use: ZambaShared, h: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """z over the sequence: the first PROMPT tokens by prefill, the rest one at a time by step."""
    use.embeddings = EmbeddingLink()
    with torch.no_grad():
        use.embeddings.value = e[:, :PROMPT]
        first, state = use.prefill(h[:, :PROMPT])
        outputs = [first]
        for t in range(PROMPT, h.shape[1]):
            use.embeddings.value = e[:, t]
            z, state = use.step(h[:, t], state)
            outputs.append(z[:, None])
    assert state["k"].shape[2] == h.shape[1] and torch.equal(state["pos"], torch.full((h.shape[0],), h.shape[1]))
    return torch.cat(outputs, dim=1)


def _inputs(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(BATCH, LENGTH, DIM, dtype=f64, generator=generator) for _ in range(2))


@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_each_use_equals_transformers_forward_and_prefill_step(setting, float64_norms):
    p = primitive(**SETTINGS[setting])
    block, linears, config = reference(p)
    uses = madsl_uses(p, block, linears)
    h, e = _inputs()
    for slot, use in enumerate(uses):
        want = transformers_use(block, linears, config, slot, h, e)
        assert want.abs().max() > 0.1  # a non-trivial output
        assert (run(use, h, e) - want).abs().max() < TOLERANCE, (setting, slot)
        assert (prefill_and_step(use, h, e) - want).abs().max() < TOLERANCE, (setting, slot)


@pytest.mark.parametrize("setting", ["rope", "gqa"])
def test_each_use_equals_transformers_as_it_is_to_float32_rounding(setting):
    p = primitive(**SETTINGS[setting])
    block, linears, config = reference(p)
    uses = madsl_uses(p, block, linears)
    h, e = _inputs()
    for slot, use in enumerate(uses):
        want = transformers_use(block, linears, config, slot, h, e)
        for got in (run(use, h, e), prefill_and_step(use, h, e)):
            assert (got - want).abs().max() < RELATIVE * want.abs().max(), (setting, slot)


def test_the_comparison_sees_a_wrong_slot_rotation_or_activation(float64_norms):
    """What the tolerance must tell apart moves the output by far more than it: the other slot's adapters
    and linear, rotary turned off, the tanh GELU for the exact one."""
    p = primitive(rope=True, qkv_adapters=True)
    block, linears, config = reference(p)
    uses = madsl_uses(p, block, linears)
    h, e = _inputs()
    want = transformers_use(block, linears, config, 0, h, e)
    use = uses[0]
    assert (run(use, h, e) - want).abs().max() < TOLERANCE
    assert (run(uses[1], h, e) - want).abs().max() > 1e-2
    use.rope = False
    assert (run(use, h, e) - want).abs().max() > 1e-2
    use.rope, use.act = True, ACTIVATIONS["gelu_tanh"]
    assert (run(use, h, e) - want).abs().max() > 1e-4


def test_two_uses_share_the_core_and_not_their_own_parts():
    p = primitive(qkv_adapters=True)
    torch.manual_seed(0)
    first = p.build()
    second = first.another_use()
    assert type(second) is ZambaShared and second.shared is first.shared and second.embeddings is None
    core = {id(t) for t in first.shared.parameters()}
    own = [[t for n, t in use.named_parameters() if not n.startswith("shared.")] for use in (first, second)]
    assert {id(t) for t in second.shared.parameters()} == core
    assert not {id(t) for t in own[0]} & {id(t) for t in own[1]} and not core & {id(t) for t in own[1]}
    # the further use's parts are made as the first's: same shapes, fresh values
    assert [t.shape for t in own[0]] == [t.shape for t in own[1]]
    assert all(not torch.equal(a, b) for a, b in zip(own[0], own[1]))
    assert sum(t.numel() for t in own[1]) == p.per_use_params() > 0
    assert sum(t.numel() for t in first.parameters()) == p.params()
    both = torch.nn.ModuleList([first, second])  # a model holds the core once
    assert sum(t.numel() for t in both.parameters()) == p.params() + p.per_use_params()
    # a gradient through the second use reaches the core the first holds
    h, e = (torch.randn(1, 3, DIM) for _ in range(2))
    second.embeddings = EmbeddingLink()
    second.embeddings.value = e
    second(h).square().sum().backward()
    assert first.shared.q_proj.weight.grad is not None and first.out.weight.grad is None


@pytest.mark.parametrize("overrides", [{}, {"qkv_adapters": True}, {"qkv_adapters": True, "kv_heads": 2}])
def test_per_use_params_counts_the_output_projection_and_the_adapters(overrides):
    p = primitive(**overrides)
    torch.manual_seed(0)
    use = p.build()
    parts = [use.out, use.gate_up_adapter] + ([use.q_adapter, use.k_adapter, use.v_adapter] * p.qkv_adapters)
    assert p.per_use_params() == sum(t.numel() for m in parts for t in m.parameters())
    assert p.params() - p.per_use_params() == sum(t.numel() for t in use.shared.parameters())


def test_grouped_keys_rotary_and_adapters_keep_the_contract():
    """kv_heads < heads with rotary and the q/k/v adapters: numel == params, the matmul FLOPs measured equal
    the accounted ones, the KV cache measured from step equals kv_cache(L), step == forward."""
    p = primitive(kv_heads=2, rope=True, qkv_adapters=True, head_dim=6)
    torch.manual_seed(0)
    use = p.build().to(f64)
    assert sum(t.numel() for t in use.parameters()) == p.params()
    assert flop_contract_error(p) is None
    h, e = _inputs(2)
    want = run(use, h, e)
    use.embeddings = EmbeddingLink()
    state = use.init_state(BATCH, dtype=f64)
    outputs = []
    with torch.no_grad():
        for t in range(LENGTH):
            use.embeddings.value = e[:, t]
            z, state = use.step(h[:, t], state)
            outputs.append(z)
    torch.testing.assert_close(torch.stack(outputs, 1), want, rtol=1e-10, atol=1e-10)
    assert state["k"][0].numel() + state["v"][0].numel() == p.kv_cache(LENGTH) == 2 * LENGTH * 2 * 6


def test_stacked_members_are_exact_under_vmap():
    """`stacks = True`: vmap over two members' stacked parameters, each member with its own embeddings (as a
    stacked model's), equals each member's own forward and parameter gradients, without a vmap fallback."""
    p = primitive(rope=True, qkv_adapters=True, kv_heads=2)
    models = []
    for seed in range(2):
        torch.manual_seed(seed)
        models.append(p.build().to(f64))
    params, buffers = torch.func.stack_module_state(models)
    generator = torch.Generator().manual_seed(4)
    h, e = (torch.randn(2, BATCH, LENGTH, DIM, dtype=f64, generator=generator) for _ in range(2))

    def loss(model, state, h, e):
        model.embeddings = EmbeddingLink()
        model.embeddings.value = e
        out = model(h) if state is None else torch.func.functional_call(model, state, (h,))
        return out.square().mean()

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        losses = torch.func.vmap(lambda pp, bb, hh, ee: loss(models[0], (pp, bb), hh, ee))(params, buffers, h, e)
    grads = torch.autograd.grad(losses.sum(), list(params.values()))
    for m, model in enumerate(models):
        want = loss(model, None, h[m], e[m])
        torch.testing.assert_close(losses[m], want, atol=1e-12, rtol=1e-10)
        for g, w in zip(grads, torch.autograd.grad(want, list(model.parameters())), strict=True):
            torch.testing.assert_close(g[m], w, atol=1e-12, rtol=1e-9)


def test_a_use_without_the_embeddings_says_so():
    use = primitive().build()
    with pytest.raises(RuntimeError, match="Zs reads the model's token embeddings"):
        use(torch.randn(1, 3, DIM))
    use.embeddings = EmbeddingLink()
    use.embeddings.value = torch.randn(1, 4, DIM)
    with pytest.raises(RuntimeError, match="as wide as its input"):
        use(torch.randn(1, 3, DIM))


@pytest.mark.parametrize(
    "overrides, key",
    [
        ({"heads": 5}, "heads"),  # 5 does not divide 2 x 32
        ({"kv_heads": 3}, "kv_heads"),
        ({"rope": True, "head_dim": 7}, "head_dim"),
        ({"norm_eps": 0.0}, "norm_eps"),
    ],
)
def test_invalid_settings_are_refused_by_key(overrides, key):
    with pytest.raises(ConfigError) as error:
        primitive(**overrides)
    assert error.value.key == key


def test_the_defaults_scale_with_the_width():
    """head_dim 2 dim / heads (Zamba2's attention_head_dim), ffn 4 x dim, scale (head_dim / 2)^-0.5."""
    entry = primitives()["zamba_shared"]
    for dim in (32, 128):
        p = entry.cls.create(dim, dict(entry.defaults))
        assert (p.inner_head_dim, p.ffn, p.scale) == (2 * dim // 4, 4 * dim, (2 * dim // 4 / 2) ** -0.5)
