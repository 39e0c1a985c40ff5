"""Other tools' descriptions of hybrid models <-> madsl specs (`madsl convert`). Every conversion is
exact or refused with the reason; nothing is approximated. Below the command line, above the
language (madsl.lang) and the plan (madsl.graph, madsl.structure); nothing imports torch.

    megatron.py     Megatron-LM / Nemotron-H hybrid layer patterns (`M-M*-`) <-> topologies
    huggingface/    Hugging Face config.json of hybrid families <-> specs: families.py (the
                    registry, from_hf_config, to_hf_config, the families refused by name),
                    config.py (a config.json read as untrusted input), base.py (what every family
                    shares), one module per family (jamba, nemotron, ibm, falcon_h1, lfm2)
"""
