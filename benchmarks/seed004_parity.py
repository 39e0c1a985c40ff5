"""Seed 004's Hugging Face models vs the specs/hybrid specs: same weights in, same logits out?

Run from the repository root: `python benchmarks/seed004_parity.py` (needs `transformers`,
not a madsl dependency; measured with 4.47, the release of the study's time, Dec 2024).
Builds GPT-Neo and Mamba from the configurations the study's main.py derives (gpt-neo-125M /
mamba-130m-hf's config.json values, written out: no hub), copies their weights into the
madsl models compiled from specs/hybrid, and compares logits on random tokens. The hybrids:
the study's HybridModel and its projectors (hybrid/hybrid_model.py, hybrid/projector.py of
github sadmankiba/hybrid-model, written out below as its code has them) around those two
models, against the specs/hybrid/*-hybrid-*.mad specs.
"""

import sys
from collections import namedtuple

import torch
from transformers import GPTNeoConfig, GPTNeoForCausalLM, MambaConfig, MambaForCausalLM

import madsl

torch.manual_seed(0)
VOCAB = 16


def gpt_neo(n_layers, dim, heads):
    # EleutherAI/gpt-neo-125M config.json, then main.py's overrides (set after construction, as from_pretrained does)
    cfg = GPTNeoConfig(
        vocab_size=50257,
        hidden_size=768,
        num_layers=12,
        num_heads=12,
        attention_types=[[["global", "local"], 6]],
        window_size=256,
        max_position_embeddings=2048,
        activation_function="gelu_new",
        intermediate_size=None,
        embed_dropout=0.0,
        attention_dropout=0.0,
        resid_dropout=0.0,
        layer_norm_epsilon=1e-5,
        initializer_range=0.02,
        tie_word_embeddings=True,
    )
    for k, v in dict(vocab_size=VOCAB, num_layers=n_layers, hidden_size=dim, num_heads=heads, pad_token_id=0).items():
        setattr(cfg, k, v)
    return GPTNeoForCausalLM(cfg).eval()


def mamba(n_layers, dim):
    # state-spaces/mamba-130m-hf config.json, then main.py's overrides
    cfg = MambaConfig(
        vocab_size=50280,
        hidden_size=768,
        state_size=16,
        num_hidden_layers=24,
        expand=2,
        conv_kernel=4,
        use_bias=False,
        use_conv_bias=True,
        time_step_rank=48,
        layer_norm_epsilon=1e-5,
        initializer_range=0.1,
        rescale_prenorm_residual=False,
        residual_in_fp32=True,
        tie_word_embeddings=True,
    )
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
        out[f"L{i}.mixer.norm.weight"] = sd[h + "ln_1.weight"]
        out[f"L{i}.mixer.norm.bias"] = sd[h + "ln_1.bias"]
        a = h + "attn.attention."
        out[f"L{i}.mixer.layer.qkv.weight"] = torch.cat(
            [sd[a + "q_proj.weight"], sd[a + "k_proj.weight"], sd[a + "v_proj.weight"]]
        )
        out[f"L{i}.mixer.layer.out.weight"] = sd[a + "out_proj.weight"]
        out[f"L{i}.mixer.layer.out.bias"] = sd[a + "out_proj.bias"]
        out[f"L{i}.channel.norm.weight"] = sd[h + "ln_2.weight"]
        out[f"L{i}.channel.norm.bias"] = sd[h + "ln_2.bias"]
        out[f"L{i}.channel.layer.fc.weight"] = sd[h + "mlp.c_fc.weight"]
        out[f"L{i}.channel.layer.fc.bias"] = sd[h + "mlp.c_fc.bias"]
        out[f"L{i}.channel.layer.proj.weight"] = sd[h + "mlp.c_proj.weight"]
        out[f"L{i}.channel.layer.proj.bias"] = sd[h + "mlp.c_proj.bias"]
    out["final_norm.weight"] = sd["transformer.ln_f.weight"]
    out["final_norm.bias"] = sd["transformer.ln_f.bias"]
    return out


def copy_mamba(hf, mm):
    sd, out = hf.state_dict(), {}
    out["embedding.weight"] = sd["backbone.embeddings.weight"]
    for i in range(len(hf.backbone.layers)):
        h = f"backbone.layers.{i}."
        out[f"L{i}.mixer.norm.weight"] = sd[h + "norm.weight"]
        for name in (
            "A_log",
            "D",
            "in_proj.weight",
            "conv1d.weight",
            "conv1d.bias",
            "x_proj.weight",
            "dt_proj.weight",
            "dt_proj.bias",
            "out_proj.weight",
        ):
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
    diff = (a - b).abs().max().item()
    err = diff / a.abs().max().item()
    hf_params = sum(p.numel() for p in hf.parameters())
    print(
        f"{name}: max |logit diff| = {diff:.2e}, / max |logit| = {err:.2e}; "
        f"params HF {hf_params:,} madsl {sum(p.numel() for p in mm.parameters()):,}"
    )
    return err


# ---- the study's hybrid (hybrid/projector.py, hybrid/hybrid_model.py), as its code has it ----------------
def _pad(x, dim):
    if x.shape[2] < dim:
        x = torch.cat([x, torch.zeros((x.shape[0], x.shape[1], dim - x.shape[2]), device=x.device)], dim=2)
    return x


class NullCombiner(torch.nn.Module):
    def __init__(self, d1, d2):
        super().__init__()

    def forward(self, x1, x2):
        d = max(x1.shape[2], x2.shape[2])
        return (_pad(x1, d) + _pad(x2, d)) / 2


class NullSplitter(torch.nn.Module):
    def __init__(self, d1, d2):
        super().__init__()
        self.d1, self.d2 = d1, d2

    def forward(self, x):
        return x[:, :, : self.d1], x[:, :, : self.d2]


class ResidualCombiner(torch.nn.Module):
    def __init__(self, d1, d2):
        super().__init__()
        self.proj_dim = max(d1, d2)
        self.in_proj1, self.in_proj2 = torch.nn.Linear(d1, self.proj_dim), torch.nn.Linear(d2, self.proj_dim)

    def forward(self, x1, x2):
        x1_proj, x2_proj = self.in_proj1(x1), self.in_proj2(x2)
        x1, x2 = _pad(x1, self.proj_dim), _pad(x2, self.proj_dim)
        return ((x1_proj + x1) + (x2_proj + x2)) / 2


class ResidualSplitter(torch.nn.Module):
    def __init__(self, d1, d2):
        super().__init__()
        self.d1, self.d2 = d1, d2
        proj_dim = max(d1, d2)
        self.out_proj1, self.out_proj2 = torch.nn.Linear(proj_dim, d1), torch.nn.Linear(proj_dim, d2)

    def forward(self, x):
        return self.out_proj1(x) + x[:, :, : self.d1], self.out_proj2(x) + x[:, :, : self.d2]


class GatedResidualCombiner(torch.nn.Module):
    def __init__(self, d1, d2):
        super().__init__()
        proj_dim = max(d1, d2)
        self.alpha1, self.alpha2 = torch.nn.Parameter(torch.ones(1)), torch.nn.Parameter(torch.ones(1))
        self.in_proj1, self.in_proj2 = torch.nn.Linear(d1, proj_dim), torch.nn.Linear(d2, proj_dim)

    def forward(self, x1, x2):
        proj_dim = self.in_proj1.weight.shape[0]
        x1_proj, x2_proj = self.in_proj1(x1), self.in_proj2(x2)
        x1, x2 = _pad(x1, proj_dim), _pad(x2, proj_dim)
        x1_proj_out = (1 - self.alpha1) * x1_proj + self.alpha1 * x1
        x2_proj_out = (1 - self.alpha2) * x2_proj + self.alpha2 * x2
        alpha1_sf, alpha2_sf = torch.softmax(torch.cat([self.alpha1, self.alpha2]), dim=0)
        return alpha1_sf * x1_proj_out + alpha2_sf * x2_proj_out


class GatedResidualSplitter(torch.nn.Module):
    def __init__(self, d1, d2):
        super().__init__()
        proj_dim = max(d1, d2)
        self.alpha1, self.alpha2 = torch.nn.Parameter(torch.ones(1)), torch.nn.Parameter(torch.ones(1))
        self.out_proj1, self.out_proj2 = torch.nn.Linear(proj_dim, d1), torch.nn.Linear(proj_dim, d2)

    def forward(self, x):
        d1, d2 = self.out_proj1.weight.shape[0], self.out_proj2.weight.shape[0]
        return (
            (1 - self.alpha1) * self.out_proj1(x) + self.alpha1 * x[:, :, :d1],
            (1 - self.alpha2) * self.out_proj2(x) + self.alpha2 * x[:, :, :d2],
        )


class GatedResidualSoftCombiner(torch.nn.Module):
    def __init__(self, d1, d2):
        super().__init__()
        proj_dim = max(d1, d2)
        self.alpha1 = torch.nn.Parameter(torch.randn(1))
        self.in_proj1, self.in_proj2 = torch.nn.Linear(d1, proj_dim), torch.nn.Linear(d2, proj_dim)

    def forward(self, x1, x2):
        proj_dim = self.in_proj1.weight.shape[0]
        x1_proj, x2_proj = self.in_proj1(x1), self.in_proj2(x2)
        x1, x2 = _pad(x1, proj_dim), _pad(x2, proj_dim)
        alpha1 = self.alpha1
        alpha2 = 1 - alpha1
        alpha_sf1, alpha_sf2 = torch.softmax(torch.cat([alpha1, alpha2]), dim=0)
        x1_proj_out = (1 - alpha_sf1) * x1_proj + alpha_sf1 * x1
        x2_proj_out = (1 - alpha_sf2) * x2_proj + alpha_sf2 * x2
        return alpha_sf1 * x1_proj_out + alpha_sf2 * x2_proj_out


class GatedResidualSoftSplitter(torch.nn.Module):
    def __init__(self, d1, d2):
        super().__init__()
        proj_dim = max(d1, d2)
        self.alpha1 = torch.nn.Parameter(torch.randn(1))
        self.out_proj1, self.out_proj2 = torch.nn.Linear(proj_dim, d1), torch.nn.Linear(proj_dim, d2)

    def forward(self, x):
        d1, d2 = self.out_proj1.weight.shape[0], self.out_proj2.weight.shape[0]
        alpha1 = self.alpha1
        alpha2 = 1 - alpha1
        alpha_sf1, alpha_sf2 = torch.softmax(torch.cat([alpha1, alpha2]), dim=0)
        return (
            (1 - alpha_sf1) * self.out_proj1(x) + alpha_sf1 * x[:, :, :d1],
            (1 - alpha_sf2) * self.out_proj2(x) + alpha_sf2 * x[:, :, :d2],
        )


PROJECTORS = {
    "null": (NullCombiner, NullSplitter),
    "res": (ResidualCombiner, ResidualSplitter),
    "gres": (GatedResidualCombiner, GatedResidualSplitter),
    "gressf": (GatedResidualSoftCombiner, GatedResidualSoftSplitter),
}


class HybridModel(torch.nn.Module):
    """The study's HybridModel.forward: GPT-Neo's embeddings; per block, the splitter feeds the block's
    GPT-Neo layers and its Mamba layers (two parallel branches), the combiner joins them; no final norm;
    GPT-Neo's lm_head."""

    def __init__(self, trans_model, mamba_model, proj_type, n_blocks):
        super().__init__()
        self.trans_model, self.mamba_model, self.n_blocks = trans_model, mamba_model, n_blocks
        self.n_trans_layers, self.n_mamba_layers = len(trans_model.transformer.h), len(mamba_model.backbone.layers)
        dim1, dim2 = trans_model.transformer.wte.weight.shape[-1], mamba_model.backbone.embeddings.weight.shape[-1]
        combiner, splitter = PROJECTORS[proj_type]
        self.combiners = torch.nn.ModuleList([combiner(dim1, dim2) for _ in range(n_blocks)])
        self.splitters = torch.nn.ModuleList([splitter(dim1, dim2) for _ in range(n_blocks)])
        self.hybrid_lm_head = trans_model.lm_head

    def forward(self, input_ids, attention_mask=None):
        trans_layers, mamba_layers = self.trans_model.transformer.h, self.mamba_model.backbone.layers
        t_emb = self.trans_model.transformer.wte(input_ids)
        p_emb = self.trans_model.transformer.wpe(torch.tensor([[i for i in range(input_ids.shape[1])]]))
        combined = t_emb + p_emb
        t_per, m_per = self.n_trans_layers // self.n_blocks, self.n_mamba_layers // self.n_blocks
        for i in range(self.n_blocks):
            trans_in, mamba_in = self.splitters[i](combined)
            for j in range(t_per):
                trans_in = trans_layers[t_per * i + j](trans_in, attention_mask=attention_mask)[0]
            for k in range(m_per):
                mamba_in = mamba_layers[m_per * i + k](mamba_in, attention_mask=attention_mask)
            combined = self.combiners[i](trans_in, mamba_in)
        return namedtuple("Output", ["logits"])(logits=self.hybrid_lm_head(combined))


def copy_hybrid(hybrid, mm):
    """The study's hybrid's weights, keyed as the madsl model compiled from its spec holds them."""
    neo, mam = copy_neo(hybrid.trans_model, mm), copy_mamba(hybrid.mamba_model, mm)
    sd = mm.state_dict()
    units = list(dict.fromkeys(k.split(".mixer.")[0] for k in sd if ".mixer." in k))
    forks = list(dict.fromkeys(k.split(".split.")[0] for k in sd if ".split." in k)) or list(
        dict.fromkeys(k.split(".branches.")[0] for k in sd if ".branches." in k)
    )
    out = {"embedding.weight": neo["embedding.weight"], "positions.weight": neo["positions.weight"]}
    t_per, m_per = hybrid.n_trans_layers // hybrid.n_blocks, hybrid.n_mamba_layers // hybrid.n_blocks
    u = 0
    for b, fork in enumerate(forks):  # madsl's stack order: block b's GPT-Neo branch, then its Mamba branch
        for source, first, count in ((neo, b * t_per, t_per), (mam, b * m_per, m_per)):
            for i in range(first, first + count):
                for k, v in source.items():
                    if k.startswith(f"L{i}."):
                        out[f"{units[u]}.{k.split('.', 1)[1]}"] = v
                u += 1
        for side, module, proj in (
            ("split", hybrid.splitters[b], "out_proj"),
            ("combine", hybrid.combiners[b], "in_proj"),
        ):
            for n in (1, 2):
                linear = getattr(module, f"{proj}{n}", None)
                if linear is not None:
                    out[f"{fork}.{side}.proj.{n - 1}.weight"] = linear.weight.detach()
                    out[f"{fork}.{side}.proj.{n - 1}.bias"] = linear.bias.detach()
            if hasattr(module, "alpha2"):
                out[f"{fork}.{side}.alpha"] = torch.cat([module.alpha1, module.alpha2]).detach()
            elif hasattr(module, "alpha1"):  # gressf: one gate a, the other side's 1 - a
                out[f"{fork}.{side}.alpha"] = module.alpha1.detach()
    missing, extra = set(sd) - set(out), set(out) - set(sd)
    assert not missing and not extra, (missing, extra)
    return out


def hybrid_init_differences(hybrid, mm):
    """Parameters whose initial spread (or, for the gates, value) differs by more than 20% between the
    study's hybrid and the madsl model (each with its own init), by madsl name. Tensors under 256
    numbers (the projectors' biases) are left out: their spread is too noisy to compare."""
    fresh, out = mm.state_dict(), []
    for k, v in copy_hybrid(hybrid, mm).items():
        if k.endswith(".alpha") and v.numel() == 1:  # gressf's gate: one draw of N(0, 1) each
            continue
        if k.endswith(".alpha"):
            a, b = v.float().mean().item(), fresh[k].float().mean().item()
        elif v.numel() >= 256:
            a, b = v.float().std().item(), fresh[k].float().std().item()
        else:
            continue
        if abs(a - b) > 0.2 * max(abs(a), abs(b), 1e-12):
            out.append(f"{k} {a:.3g} vs {b:.3g}")
    return out


worst = 0.0
for path, n, dim, heads, L in [
    ("specs/hybrid/icr-transformer-2.mad", 2, 128, 16, 64),
    ("specs/hybrid/selcopy-transformer.mad", 12, 32, 2, 20),
]:
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
# the hybrids: (spec, layers of each kind, blocks, the study's proj_type, hidden_size, num_heads, length)
HYBRIDS = [
    (f"specs/hybrid/selcopy-hybrid-{name}-{blocks}{suffix}.mad", layers, blocks, proj, 32, 2, 20)
    for name, proj in (("null", "null"), ("res", "res"), ("gated", "gres"), ("gsoft", "gressf"))
    for blocks in (1, 2)
    for suffix, layers in (("", 2), ("-12", 12))
]
HYBRIDS += [
    (f"specs/hybrid/selcopy-hybrid-{name}-1-1.mad", 1, 1, proj, 32, 2, 20)
    for name, proj in (("gated", "gres"), ("gsoft", "gressf"))
]
HYBRIDS += [
    ("specs/hybrid/icr-hybrid.mad", 2, 1, "gres", 128, 16, 16),
    ("specs/hybrid/icr-hybrid-12.mad", 12, 1, "gres", 128, 16, 16),
]
worst_hybrid = 0.0
for path, n, blocks, proj, dim, heads, L in HYBRIDS:
    hybrid = HybridModel(gpt_neo(n, dim, heads), mamba(n, dim)[0], proj, blocks).eval()
    mm = madsl.compile(madsl.load_spec(path), vocab_size=VOCAB, max_seq_len=L).eval()
    print("  init spread differs (study vs madsl):", hybrid_init_differences(hybrid, mm)[:6] or "none")
    with torch.no_grad():  # the gates off their initial 1, so that every projector term counts
        for module in list(hybrid.splitters) + list(hybrid.combiners):
            for name, param in module.named_parameters():
                if name.startswith("alpha"):
                    param.uniform_(0.2, 0.8)
    mm.load_state_dict(copy_hybrid(hybrid, mm))
    worst_hybrid = max(worst_hybrid, compare(path, hybrid, mm, L))
worst = max(worst, worst_hybrid)
print(f"worst relative logit difference {worst:.1e} (hybrids {worst_hybrid:.1e})")
sys.exit(0 if worst < 1e-5 else 1)
