"""Hugging Face config.json of hybrid families <-> specs at their first address: `madsl.hf_config` is
`madsl.interop.huggingface.families` (the registry of families, and the families refused by name)."""

from __future__ import annotations

from madsl.interop.huggingface.families import (
    FAMILIES,
    REFUSED,
    HfRead,
    family,
    from_hf_config,
    read_hf_config,
    to_hf_config,
)

__all__ = ["FAMILIES", "REFUSED", "HfRead", "family", "from_hf_config", "read_hf_config", "to_hf_config"]
