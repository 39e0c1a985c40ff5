"""Pretrained weights: local Hugging Face checkpoints into compiled madsl models (`madsl import`,
`madsl.load_pretrained`; docs/weights.md).

    checkpoint.py   a checkpoint folder read as untrusted input: config.json, safetensors (one file
                    or shards by model.safetensors.index.json), pickle files refused by name
    parts.py        what a family's name map says: model tensor -> checkpoint tensors and shapes
    mapping.py      the families' registry, and the check that a checkpoint fills a model exactly
    lfm2.py         LFM2's name map (one module a family)
    bamba.py        Bamba's (Mamba-2 and attention layers)
    nemotron_h.py   Nemotron-H's (Mamba-2, attention and MLP layers, paired into blocks)
    mamba2.py       what madsl's Mamba-2 does not compute, refused by key (both families)
    load.py         import_checkpoint / load_pretrained: convert, compile, check, load
    export.py       export_hf: a model out as a checkpoint, the name map run backwards
"""

from madsl.weights.export import export_hf
from madsl.weights.load import Imported, import_checkpoint, load_pretrained

__all__ = ["Imported", "export_hf", "import_checkpoint", "load_pretrained"]
