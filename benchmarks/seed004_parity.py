"""Seed 004's Hugging Face models vs the specs/hybrid specs: same weights in, same logits out?

Run from the repository root: `python benchmarks/seed004_parity.py` (needs `transformers`,
not a madsl dependency; measured with 4.47, the release of the study's time, Dec 2024).
Builds GPT-Neo and Mamba from the configurations the study's main.py derives (gpt-neo-125M /
mamba-130m-hf's config.json values, written out: no hub), copies their weights into the
madsl models compiled from specs/hybrid, and compares logits on random tokens.
"""
import sys
import torch
import madsl
from transformers import GPTNeoConfig, GPTNeoForCausalLM, MambaConfig, MambaForCausalLM

torch.manual_seed(0)
VOCAB = 16


def gpt_neo(n_layers, dim, heads):
    # EleutherAI/gpt-neo-125M config.json, then main.py's overrides (set after construction, as from_pretrained does)
    cfg = GPTNeoConfig(vocab_size=50257, hidden_size=768, num_layers=12, num_heads=12,
                       attention_types=[[["global", "local"], 6]], window_size=256, max_position_embeddings=2048,
                       activation_function="gelu_new", intermediate_size=None, embed_dropout=0.0,
                       attention_dropout=0.0, resid_dropout=0.0, layer_norm_epsilon=1e-5, initializer_range=0.02,
                       tie_word_embeddings=True)
    for k, v in dict(vocab_size=VOCAB, num_layers=n_layers, hidden_size=dim, num_heads=heads, pad_token_id=0).items():
        setattr(cfg, k, v)
    return GPTNeoForCausalLM(cfg).eval()


def mamba(n_layers, dim):
    # state-spaces/mamba-130m-hf config.json, then main.py's overrides
    cfg = MambaConfig(vocab_size=50280, hidden_size=768, state_size=16, num_hidden_layers=24, expand=2,
                      conv_kernel=4, use_bias=False, use_conv_bias=True, time_step_rank=48,
                      layer_norm_epsilon=1e-5, initializer_range=0.1, rescale_prenorm_residual=False,
                      residual_in_fp32=True, tie_word_embeddings=True)
    for k, v in dict(vocab_size=VOCAB, num_hidden_layers=n_layers, hidden_size=dim, pad_token_id=50256).items():
        setattr(cfg, k, v)
    return MambaForCausalLM(cfg).eval(), cfg


def copy_neo(hf, mm):
    sd, out = hf.state_dict(), {}
    out["embedding.weight"] = sd["transformer.wte.weight"]
    n_pos = mm.positions.num_embeddings
    out["positions.weight"] = sd["transformer.wpe.weight"][:n_pos]
    for i in range(len(hf.transformer.h)):
        h = f"transformer.h.{i}."
        b = f"body.{i // 2}.blocks.{i % 2}." if False else None
        out[f"L{i}.mixer.norm.weight"] = sd[h + "ln_1.weight"]; out[f"L{i}.mixer.norm.bias"] = sd[h + "ln_1.bias"]
        a = h + "attn.attention."
        out[f"L{i}.mixer.layer.qkv.weight"] = torch.cat([sd[a + "q_proj.weight"], sd[a + "k_proj.weight"], sd[a + "v_proj.weight"]])
        out[f"L{i}.mixer.layer.out.weight"] = sd[a + "out_proj.weight"]; out[f"L{i}.mixer.layer.out.bias"] = sd[a + "out_proj.bias"]
        out[f"L{i}.channel.norm.weight"] = sd[h + "ln_2.weight"]; out[f"L{i}.channel.norm.bias"] = sd[h + "ln_2.bias"]
        out[f"L{i}.channel.layer.fc.weight"] = sd[h + "mlp.c_fc.weight"]; out[f"L{i}.channel.layer.fc.bias"] = sd[h + "mlp.c_fc.bias"]
        out[f"L{i}.channel.layer.proj.weight"] = sd[h + "mlp.c_proj.weight"]; out[f"L{i}.channel.layer.proj.bias"] = sd[h + "mlp.c_proj.bias"]
    out["final_norm.weight"] = sd["transformer.ln_f.weight"]; out["final_norm.bias"] = sd["transformer.ln_f.bias"]
    return out


def copy_mamba(hf, mm):
    sd, out = hf.state_dict(), {}
    out["embedding.weight"] = sd["backbone.embeddings.weight"]
    for i in range(len(hf.backbone.layers)):
        h = f"backbone.layers.{i}."
        out[f"L{i}.mixer.norm.weight"] = sd[h + "norm.weight"]
        for name in ("A_log", "D", "in_proj.weight", "conv1d.weight", "conv1d.bias", "x_proj.weight",
                     "dt_proj.weight", "dt_proj.bias", "out_proj.weight"):
            out[f"L{i}.mixer.layer.{name}"] = sd[h + "mixer." + name]
    out["final_norm.weight"] = sd["backbone.norm_f.weight"]
    return out


def load_layers(mm, flat):
    """Map L{i}.<rest> onto the madsl model's i-th layer unit, in stack order."""
    keys = list(mm.state_dict())
    units = []  # madsl layer prefixes in order: the prefix before '.mixer.' of each key
    for k in keys:
        if ".mixer." in k:
            p = k.split(".mixer.")[0]
            if p not in units:
                units.append(p)
    sd = {}
    for k, v in flat.items():
        if k.startswith("L"):
            i, rest = k[1:].split(".", 1)
            sd[f"{units[int(i)]}.{rest}"] = v
        else:
            sd[k] = v
    missing = set(keys) - set(sd)
    assert not missing, missing
    mm.load_state_dict(sd)


def init_differences(hf_flat, mm):
    """Parameters whose initial spread differs by more than 20% between the two builds (each
    with its own init): where the specs' initialisation is not the Hugging Face model's."""
    fresh = dict(mm.state_dict())
    units = [k.split(".mixer.")[0] for k in fresh if ".mixer." in k]
    units = list(dict.fromkeys(units))
    out = []
    for k, v in hf_flat.items():
        key = f"{units[int(k[1:].split('.', 1)[0])]}.{k.split('.', 1)[1]}" if k.startswith("L") else k
        a, b = v.float().std().item(), fresh[key].float().std().item()
        if v.numel() > 1 and abs(a - b) > 0.2 * max(a, b, 1e-12):
            out.append(f"{k} {a:.3g} vs {b:.3g}")
    return out


def compare(name, hf, mm, length):
    x = torch.randint(0, VOCAB, (4, length))
    with torch.no_grad():
        a = hf(input_ids=x).logits
        b = mm(x)
    err = (a - b).abs().max().item() / a.abs().max().item()
    hf_params = sum(p.numel() for p in hf.parameters())
    print(f"{name}: max |logit diff| / max |logit| = {err:.2e}; params HF {hf_params:,} madsl {sum(p.numel() for p in mm.parameters()):,}")
    return err


worst = 0.0
for path, n, dim, heads, L in [("specs/hybrid/icr-transformer-2.mad", 2, 128, 16, 64),
                               ("specs/hybrid/selcopy-transformer.mad", 12, 32, 2, 20)]:
    hf = gpt_neo(n, dim, heads)
    mm = madsl.compile(madsl.load_spec(path), vocab_size=VOCAB, max_seq_len=L).eval()
    flat = copy_neo(hf, mm)
    print("  init spread differs (HF vs madsl):", init_differences(flat, mm)[:6] or "none")
    load_layers(mm, flat)
    worst = max(worst, compare(path, hf, mm, L))
for path, n, dim, L in [("specs/hybrid/icr-mamba-4.mad", 4, 128, 64), ("specs/hybrid/selcopy-mamba-2.mad", 2, 32, 20)]:
    hf, cfg = mamba(n, dim)
    assert (cfg.intermediate_size, cfg.time_step_rank) == (1536, 48), (cfg.intermediate_size, cfg.time_step_rank)
    mm = madsl.compile(madsl.load_spec(path), vocab_size=VOCAB, max_seq_len=L).eval()
    flat = copy_mamba(hf, mm)
    print("  init spread differs (HF vs madsl):", init_differences(flat, mm)[:6] or "none")
    load_layers(mm, flat)
    worst = max(worst, compare(path, hf, mm, L))
print(f"worst relative logit difference {worst:.1e}")
sys.exit(0 if worst < 1e-5 else 1)
