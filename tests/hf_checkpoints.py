"""Tiny Hugging Face checkpoints made here by transformers, every weight random, for the import and
export tests (tests/test_import_hf.py, test_import_mamba.py, test_export_hf.py): nothing is
downloaded. Each maker saves into `folder` and returns it."""

from __future__ import annotations

from pathlib import Path

import torch
import transformers

VOCAB = 61


def lfm2(folder: Path, *, tied: bool = True, bias: bool = False, shard: str | None = None, **extra) -> Path:
    """A tiny LFM2 (conv and attention layers, grouped-query heads) with every weight random,
    norms included, saved by transformers into `folder`; returns the folder."""
    config = transformers.Lfm2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=96,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        layer_types=["conv", "full_attention", "conv", "full_attention"],
        conv_bias=bias,
        tie_word_embeddings=tied,
        max_position_embeddings=64,
        **extra,
    )
    torch.manual_seed(0)
    model = transformers.Lfm2ForCausalLM(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("norm.weight"):
                parameter.uniform_(0.5, 1.5)
            else:
                parameter.normal_(0.0, 0.3 if parameter.dim() > 1 else 0.1)
    kwargs = {"max_shard_size": shard} if shard else {}
    model.save_pretrained(folder, **kwargs)
    return folder


def reference(folder: Path, ids):
    """transformers' own logits of the checkpoint in `folder` on the token ids `ids`."""
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        return model(ids).logits


def prefill_and_step_error(model, ids, expected, prompt: int) -> float:
    """The largest difference from `expected` (transformers' logits of `ids`) of `model`'s logits
    through prefill of the first `prompt` tokens and then a step per token."""
    logits, state = model.prefill(ids[:, :prompt])
    error = (logits - expected[:, :prompt]).abs().max().item()
    for position in range(prompt, ids.shape[1]):
        logits, state = model.step(ids[:, position], state)
        error = max(error, (logits - expected[:, position]).abs().max().item())
    return error


def tokens(length: int = 13):
    return torch.randint(0, VOCAB, (2, length), generator=torch.Generator().manual_seed(1))


def bamba(folder: Path, *, tied: bool = False, groups: int = 2, **extra) -> Path:
    """A tiny Bamba (two Mamba-2 layers of 2 groups, one attention layer with grouped-query
    heads) with every weight random, saved by transformers into `folder`."""
    config = transformers.BambaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        attn_layer_indices=[1],
        mamba_n_heads=4,
        mamba_d_head=16,
        mamba_n_groups=groups,
        mamba_d_state=8,
        mamba_d_conv=4,
        mamba_expand=2,
        mamba_chunk_size=8,  # several chunks in the reference's scan, as in madsl's
        max_position_embeddings=64,
        tie_word_embeddings=tied,
        **extra,
    )
    return randomized(transformers.BambaForCausalLM(config), folder)


def nemotron_h(folder: Path, pattern: str = "M-*-", **extra) -> Path:
    """A tiny Nemotron-H of `pattern` (M Mamba-2 of 2 groups, * attention, - MLP) with every weight
    random, saved by transformers into `folder`."""
    config = transformers.NemotronHConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=len(pattern),
        hybrid_override_pattern=pattern,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        mamba_num_heads=4,
        mamba_head_dim=16,
        n_groups=2,
        ssm_state_size=8,
        conv_kernel=4,
        expand=2,
        chunk_size=8,
        max_position_embeddings=64,
        tie_word_embeddings=False,
        **extra,
    )
    return randomized(transformers.NemotronHForCausalLM(config), folder)


def jamba(folder: Path, *, experts: int = 4, tied: bool = False, **extra) -> Path:
    """A tiny Jamba (Mamba-1 layers with dt, B and C norms and attention layers, alternating; a
    mixture of `experts` SwiGLU experts every other layer, 2 active) with every weight random, saved
    by transformers into `folder`."""
    config = transformers.JambaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        attn_layer_period=2,
        attn_layer_offset=1,
        expert_layer_period=2,
        expert_layer_offset=1,
        num_experts=experts,
        num_experts_per_tok=min(2, experts),
        mamba_d_state=8,
        mamba_dt_rank=4,
        tie_word_embeddings=tied,
        **extra,
    )
    return randomized(transformers.JambaForCausalLM(config), folder)


def granite(folder: Path, *, experts: int = 4, **extra) -> Path:
    """A tiny Granite 4.0 hybrid (Mamba-2 of 2 groups and rotary attention layers; `experts` SwiGLU
    experts beside the shared SwiGLU, 0: the shared one alone) with µP-style multipliers off their
    defaults and every weight random, saved by transformers into `folder`."""
    config = transformers.GraniteMoeHybridConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=24,
        shared_intermediate_size=40,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        layer_types=["mamba", "attention", "mamba"],
        num_local_experts=experts,
        num_experts_per_tok=2 if experts else 0,
        mamba_n_heads=4,
        mamba_d_head=16,
        mamba_n_groups=2,
        mamba_d_state=8,
        mamba_chunk_size=8,
        embedding_multiplier=3.0,
        residual_multiplier=0.6,
        attention_multiplier=0.2,
        logits_scaling=1.5,
        position_embedding_type="rope",
        max_position_embeddings=64,
        **extra,
    )
    return randomized(transformers.GraniteMoeHybridForCausalLM(config), folder)


def mamba(folder: Path, *, tied: bool = True, layers: int = 3, **extra) -> Path:
    """A tiny Mamba (Hugging Face's Mamba-1: mamba-130m-hf's layout) with every weight random, saved
    by transformers into `folder`."""
    config = transformers.MambaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        state_size=8,
        num_hidden_layers=layers,
        expand=2,
        conv_kernel=4,
        tie_word_embeddings=tied,
        **extra,
    )
    return randomized(transformers.MambaForCausalLM(config), folder)


def gpt_neo(folder: Path, *, tied: bool = True, layers: int = 4, **extra) -> Path:
    """A tiny GPT-Neo (global and local attention alternating, a window of 5 tokens; gpt-neo-125M's
    layout) with every weight random, saved by transformers into `folder`."""
    config = transformers.GPTNeoConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_layers=layers,
        num_heads=4,
        attention_types=[[["global", "local"], layers // 2]],
        window_size=5,
        max_position_embeddings=64,
        tie_word_embeddings=tied,
        bos_token_id=0,
        eos_token_id=0,
        **extra,
    )
    return randomized(transformers.GPTNeoForCausalLM(config), folder)


def xlstm(folder: Path, **extra) -> Path:
    """A tiny xLSTM (two mLSTM blocks of 4 heads, each with its SwiGLU; xLSTM-7B's layout, queries
    and keys as wide as the values: transformers' native kernels fail at xLSTM-7B's qk_dim_factor
    0.5 in 5.24) with its logits soft-capped at 4 and every weight random, saved into `folder`."""
    extra = {"qk_dim_factor": 1.0, "output_logit_soft_cap": 4.0, **extra}
    config = transformers.xLSTMConfig(
        vocab_size=VOCAB, hidden_size=64, embedding_dim=64, num_hidden_layers=2, num_blocks=2, num_heads=4, **extra
    )
    return randomized(transformers.xLSTMForCausalLM(config), folder)


def lfm2_moe(folder: Path, **extra) -> Path:
    """A tiny LFM2-MoE (conv and attention layers; the first followed by a SwiGLU, the others by 4
    SwiGLU experts, 2 active, routed by sigmoid scores and a random expert bias), saved into `folder`."""
    config = transformers.Lfm2MoeConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        moe_intermediate_size=24,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        layer_types=["conv", "full_attention", "conv", "full_attention"],
        num_dense_layers=1,
        num_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=64,
        **extra,
    )
    return randomized(transformers.Lfm2MoeForCausalLM(config), folder)


def randomized(model, folder: Path) -> Path:
    """`model` with every weight random (norms near 1, A_log and dt_bias in Mamba-2's ranges) and its
    routers' selection biases random, saved."""
    torch.manual_seed(0)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith(("norm.weight", "norm_f.weight", "ln_1.weight", "ln_2.weight", "ln_f.weight")):
                parameter.uniform_(0.5, 1.5)
            elif name.endswith("A_log"):
                parameter.uniform_(0.0, 2.0)
            elif name.endswith("dt_bias"):
                parameter.uniform_(-3.0, 0.0)
            else:
                parameter.normal_(0.0, 0.3 if parameter.dim() > 1 else 0.1)
        for name, buffer in model.named_buffers():  # the routers' selection biases, which pick experts
            if name.endswith(("expert_bias", "e_score_correction_bias")):
                buffer.normal_(0.0, 0.3)
    model.eval().save_pretrained(folder)
    return folder


def recurrent_gemma(folder: Path, *, tied: bool = True, bias: bool = False, **extra) -> Path:
    """A tiny RecurrentGemma (recurrent, recurrent, attention, recurrent; the RG-LRU 48 wide in 4 gate
    blocks, local attention over 5 tokens with 2 key-value heads, rotary on half of each head) with
    every weight random, norms included, its logits soft-capped at 10, saved into `folder`; the
    recurrent_param from Griffin's init range (decays near 1) to far below it."""
    extra = {"logits_soft_cap": 10.0, **extra}
    config = transformers.RecurrentGemmaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=96,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        lru_width=48,
        attention_window_size=5,
        attention_bias=bias,
        tie_word_embeddings=tied,
        **extra,
    )
    model = transformers.RecurrentGemmaForCausalLM(config)
    randomized(model, folder)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("recurrent_param"):
                parameter.uniform_(-7.0, 1.0)  # softplus 0.001 (a near 1) to 1.3
    model.save_pretrained(folder)
    return folder


def kimi_linear(folder: Path, **extra) -> Path:
    """A tiny Kimi Linear (KDA, MLA, KDA, MLA; the first followed by a SwiGLU, the others by 4 SwiGLU
    experts, 2 active, beside a shared one, routed by sigmoid scores and a random correction bias,
    scaled by 2.5) with every weight random, norms, A_log and dt_bias included, saved into `folder`.
    transformers' KDA and its convolutions run their PyTorch paths (`kimi_linear_torch_paths`)."""
    kimi_linear_torch_paths()
    args = {
        "vocab_size": VOCAB,
        "hidden_size": 32,
        "intermediate_size": 48,
        "moe_intermediate_size": 24,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "kv_lora_rank": 16,
        "qk_nope_head_dim": 8,
        "qk_rope_head_dim": 4,
        "v_head_dim": 12,
        "layer_types": ["linear_attention", "full_attention", "linear_attention", "full_attention"],
        "mlp_layer_types": ["dense", "sparse", "sparse", "sparse"],
        "linear_num_heads": 2,
        "linear_head_dim": 8,
        "linear_conv_kernel_dim": 3,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "n_shared_experts": 1,
        "routed_scaling_factor": 2.5,
        "pad_token_id": None,
        "bos_token_id": 0,
        "eos_token_id": 0,
        **extra,
    }
    return randomized(transformers.KimiLinearForCausalLM(transformers.KimiLinearConfig(**args)), folder)


def kimi_linear_torch_paths() -> None:
    """transformers' Kimi Linear with its PyTorch chunked and recurrent delta rule and causal
    convolutions, for the rest of the process: where flash-linear-attention is installed, transformers
    calls its Triton kernels instead, which need a GPU (Triton's CPU interpreter finds no driver for
    their autotuner)."""
    from transformers.models.kimi_linear import modeling_kimi_linear as modeling

    for name in ("chunk_kimi_delta_attention", "recurrent_kimi_delta_attention", "causal_conv1d_fn"):
        function = getattr(modeling, name)
        setattr(modeling, name, getattr(function, "__wrapped__", function))
    update = modeling.causal_conv1d_update
    modeling.causal_conv1d_update = getattr(update, "__wrapped__", update)


# Falcon-H1's µP multipliers off their defaults (each folded into a weight on import, or the spec's scale)
FALCON_H1_MULTIPLIERS = {
    "embedding_multiplier": 1.7,
    "lm_head_multiplier": 0.6,
    "attention_in_multiplier": 0.8,
    "attention_out_multiplier": 1.3,
    "key_multiplier": 0.45,
    "ssm_in_multiplier": 1.25,
    "ssm_out_multiplier": 0.7,
    "ssm_multipliers": [0.35, 0.25, 0.4, 0.5, 1.5],  # z, x, B, C, dt
    "mlp_multipliers": [0.9, 0.6],  # gate, down
}


def falcon_h1(
    folder: Path, *, tied: bool = False, groups: int = 2, bias: bool = False, gated_norm: bool = False, **extra
) -> Path:
    """A tiny Falcon-H1 (two layers, each rotary attention with grouped-query heads beside a Mamba-2
    of `groups` groups, then a SwiGLU) with its µP multipliers off their defaults and every weight
    random, saved by transformers into `folder`; `bias`: on every projection (attention, Mamba-2,
    MLP); `gated_norm`: the Mamba-2 gate's RMSNorm after the gate, every norm at eps 1e-6."""
    if bias:
        extra = {"attention_bias": True, "mlp_bias": True, "mamba_proj_bias": True, "projectors_bias": True, **extra}
    if gated_norm:
        extra = {"mamba_rms_norm": True, "mamba_norm_before_gate": False, "rms_norm_eps": 1e-6, **extra}
    config = transformers.FalconH1Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        mamba_d_ssm=64,
        mamba_n_heads=4,
        mamba_d_head=16,
        mamba_n_groups=groups,
        mamba_d_state=8,
        mamba_chunk_size=8,  # several chunks in the reference's scan
        max_position_embeddings=64,
        tie_word_embeddings=tied,
        **{**FALCON_H1_MULTIPLIERS, **extra},
    )
    return randomized(transformers.FalconH1ForCausalLM(config), folder)


def minimax(folder: Path, *, tied: bool = False, factors: bool = True, std: float = 0.2, **extra) -> Path:
    """A tiny MiniMax-Text-01 (lightning attention layers of 4 heads with softmax attention between,
    each followed by 4 SwiGLU experts, 2 active; blocks of 8 tokens in the lightning attention's
    block form) with its residual alpha and beta factors off 1 (`factors`), every weight random,
    saved by transformers into `folder` (the decay buffers with it, as transformers saves them)."""
    residual = {"full_attn_alpha_factor": 1.7, "full_attn_beta_factor": 0.6, "linear_attn_alpha_factor": 2.3}
    residual |= {"linear_attn_beta_factor": 0.8, "mlp_alpha_factor": 1.4, "mlp_beta_factor": 1.3}
    kinds = ["linear_attention", "linear_attention", "full_attention", "linear_attention"]
    config = transformers.MiniMaxConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=24,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        num_local_experts=4,
        num_experts_per_tok=2,
        layer_types=kinds,
        block_size=8,
        rms_norm_eps=1e-6,
        max_position_embeddings=64,
        tie_word_embeddings=tied,
        **(residual if factors else {}),
        **extra,
    )
    model = transformers.MiniMaxForCausalLM(config)
    torch.manual_seed(0)
    with torch.no_grad():  # matrices narrower than randomized's: at 0.3 the stack amplifies float32 rounding
        for name, parameter in model.named_parameters():
            parameter.uniform_(0.5, 1.5) if name.endswith("norm.weight") else parameter.normal_(0.0, std)
    model.eval().save_pretrained(folder)
    return folder


QWEN_LINEAR = {  # a Gated DeltaNet of 2 key heads of 8 and 4 value heads of 16 (2 a key head), conv of 4 taps
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 8,
    "linear_value_head_dim": 16,
    "linear_conv_kernel_dim": 4,
}
QWEN_EXPERTS = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 24}


def qwen3_next(folder: Path, **extra) -> Path:
    """A tiny Qwen3-Next (Gated DeltaNet, gated attention, Gated DeltaNet, gated attention: each followed
    by 4 SwiGLU experts, 2 active, beside a gated shared expert, but the second, a SwiGLU by
    mlp_only_layers) with every weight random, norms included, saved by transformers into `folder`."""
    config = transformers.Qwen3NextConfig(
        **_qwen_args(
            num_hidden_layers=4,
            layer_types=["linear_attention", "full_attention"] * 2,
            mlp_only_layers=[1],
            shared_expert_intermediate_size=20,
            **QWEN_EXPERTS,
        ),
        **extra,
    )
    return _qwen_randomized(transformers.Qwen3NextForCausalLM(config), folder)


def qwen3_5(folder: Path, *, experts: bool = False, vision: bool = False, **extra) -> Path:
    """A tiny Qwen3.5 language model (Gated DeltaNet, gated attention, Gated DeltaNet; each followed by
    a SwiGLU, or with `experts` by Qwen3.5 MoE's 4 experts beside a gated shared expert), every weight
    random, saved into `folder`; `vision`: inside a vision-language Qwen3.5 (Qwen3_5ForConditionalGeneration,
    its tiny vision encoder random too), as the published checkpoints are."""
    moe = {**QWEN_EXPERTS, "shared_expert_intermediate_size": 20} if experts else {}
    args = _qwen_args(num_hidden_layers=3, layer_types=["linear_attention", "full_attention", "linear_attention"])
    text = {**args, **moe, **extra}
    if not vision:
        config = (transformers.Qwen3_5MoeTextConfig if experts else transformers.Qwen3_5TextConfig)(**text)
        causal = transformers.Qwen3_5MoeForCausalLM if experts else transformers.Qwen3_5ForCausalLM
        return _qwen_randomized(causal(config), folder)
    eye = {"depth": 1, "hidden_size": 16, "intermediate_size": 24, "num_heads": 2, "out_hidden_size": 32}
    config = (transformers.Qwen3_5MoeConfig if experts else transformers.Qwen3_5Config)(
        text_config=text, vision_config=eye
    )
    whole = transformers.Qwen3_5MoeForConditionalGeneration if experts else transformers.Qwen3_5ForConditionalGeneration
    return _qwen_randomized(whole(config), folder)


def _qwen_args(**layers) -> dict:
    """The sizes the tiny Qwen3-Next and Qwen3.5 share: 4 query heads of 16 over 2 key-value heads,
    rotary on a quarter of each head (the family's partial_rotary_factor), the Gated DeltaNet above."""
    return {
        "vocab_size": VOCAB,
        "hidden_size": 32,
        "intermediate_size": 48,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "max_position_embeddings": 128,
        **QWEN_LINEAR,
        **layers,
    }


def _qwen_randomized(model, folder: Path) -> Path:
    """`model` with every weight random, saved: its zero-centred RMSNorms (x * (1 + w)) at w in
    (-0.5, 0.5), the Gated DeltaNet's plain output norm near 1, A_log and dt_bias in their ranges.
    transformers' gated delta rule and causal convolutions run their PyTorch paths (`qwen_torch_paths`)."""
    qwen_torch_paths()
    torch.manual_seed(0)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("linear_attn.norm.weight"):
                parameter.uniform_(0.5, 1.5)
            elif name.endswith("norm.weight") and "visual" not in name:
                parameter.uniform_(-0.5, 0.5)
            elif name.endswith("A_log"):
                parameter.uniform_(0.0, 2.0)
            elif name.endswith("dt_bias"):
                parameter.uniform_(-3.0, 0.0)
            else:
                parameter.normal_(0.0, 0.3 if parameter.dim() > 1 else 0.1)
    model.eval().save_pretrained(folder)
    return folder


def qwen_torch_paths() -> None:
    """transformers' Qwen3-Next and Qwen3.5 with their PyTorch chunked and recurrent gated delta rule
    and causal convolutions, for the rest of the process (as `kimi_linear_torch_paths`: fla's Triton
    kernels, which transformers calls where fla is installed, need a GPU)."""
    import importlib

    for name in ("qwen3_next.modeling_qwen3_next", "qwen3_5.modeling_qwen3_5", "qwen3_5_moe.modeling_qwen3_5_moe"):
        modeling = importlib.import_module(f"transformers.models.{name}")
        for function in (
            "torch_chunk_gated_delta_rule",
            "torch_recurrent_gated_delta_rule",
            "causal_conv1d_fn",
            "causal_conv1d_update",
        ):
            wrapped = getattr(modeling, function)
            setattr(modeling, function, getattr(wrapped, "__wrapped__", wrapped))


ZAMBA2_KINDS = ["mamba", "hybrid", "mamba", "hybrid", "hybrid", "mamba", "hybrid"]  # 4 uses of the shared blocks


def zamba2(folder: Path, *, kinds: list[str] | None = None, dt_floor: bool = False, **extra) -> Path:
    """A tiny Zamba2 (Mamba-2 layers of 4 heads in 2 groups, `kinds` saying which are hybrid: 4 uses of
    num_mem_blocks shared blocks, each 4 heads of 16 over the 2 x 32 wide input, rank-4 adapters) with every
    weight random, norms included, saved by transformers into `folder` (save_pretrained keeps each shared
    block once, under its first hybrid layer). Matrices at std 0.15, narrower than `randomized`'s: at 0.3 this
    7-layer stack amplifies float32 rounding until transformers disagrees with itself by 2e-2 between two
    chunk sizes of its own scan (1e-5 at 0.15). `dt_floor`: the first Mamba-2 layer's dt_bias so low that
    softplus falls below time_step_min (0.01 here), where transformers' clamp decides the step."""
    kinds = kinds or ZAMBA2_KINDS
    config = transformers.Zamba2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=len(kinds),
        layers_block_type=kinds,
        num_attention_heads=4,
        adapter_rank=4,
        mamba_d_state=8,
        mamba_ngroups=2,
        n_mamba_heads=4,
        chunk_size=8,  # several chunks in the reference's scan
        max_position_embeddings=64,
        **{"time_step_min": 0.01, **extra},
    )
    model = transformers.Zamba2ForCausalLM(config)
    torch.manual_seed(0)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("norm.weight"):
                parameter.uniform_(0.5, 1.5)
            elif name.endswith("A_log"):
                parameter.uniform_(0.0, 2.0)
            elif name.endswith("dt_bias"):  # with dt_floor, the first layer's softplus at 1e-4..1e-3
                low = dt_floor and name.startswith("model.layers.0.")
                parameter.uniform_(-9.0, -7.0) if low else parameter.uniform_(-3.0, 0.0)
            else:
                parameter.normal_(0.0, 0.15 if parameter.dim() > 1 else 0.1)
    model.eval().save_pretrained(folder)
    return folder
