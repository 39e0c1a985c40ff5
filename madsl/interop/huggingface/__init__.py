"""Hugging Face config.json of hybrid model families <-> madsl specs (`madsl convert --from-hf/--to-hf`).

families.py    the registry (FAMILIES), from_hf_config, to_hf_config, the families refused by
               name (REFUSED); `madsl.hf_config` is this module at its first address
config.py      a config.json read as untrusted input: size, encoding, nesting and numbers
               bounded, every value a family reads checked and located by its JSON key (Config);
               a key left out taken at transformers' default and listed, or refused by name
shown.py       how values and keys are shown in its errors
base.py        what every family shares: Family, Stack, the readers of attention, Mamba-2 and
               rotary settings, the spec's data
jamba.py       Jamba (AI21)
nemotron.py    Nemotron-H, Nemotron-Nano-v2, NVIDIA-Nemotron-3 (NVIDIA)
ibm.py         Granite 4.0 hybrids and Bamba (IBM)
falcon_h1.py   Falcon-H1 (TII)
lfm2.py        LFM2 and LFM2-MoE (Liquid AI)
qwen3_next.py  Qwen3-Next and Qwen3.5's language models (Qwen)
recurrent_gemma.py  RecurrentGemma (Google)
kimi_linear.py  Kimi Linear (Moonshot AI)
minimax.py     MiniMax-Text-01 and MiniMax-M1 (MiniMax)
"""
