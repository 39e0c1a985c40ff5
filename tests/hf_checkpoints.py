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
