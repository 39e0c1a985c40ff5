"""What madsl's Mamba-2 and RMSNorms cannot compute as a Mamba-2 family's checkpoint does, refused by
the config key that says it (the name maps of bamba.py and nemotron_h.py share it): a norm eps other
than madsl's 1e-5 (its RMSNorms and the Mamba-2 gate's), and a `time_step_limit` that clamps the
step size dt (madsl's Mamba-2 does not clamp it)."""

from __future__ import annotations

import math
from typing import Any

from madsl.errors import MadslError

NORM_EPS = 1e-5  # madsl's RMSNorm (madsl.model_parts.make_norm) and Mamba-2's gated norm


def check_mamba2_config(config: dict[str, Any], path: str, eps_key: str | None, family: str) -> None:
    """Refuse by key a norm eps (`eps_key`; None: the spec states the family's eps) madsl does not
    compute and a clamping time_step_limit."""
    eps = config.get(eps_key, NORM_EPS) if eps_key else NORM_EPS
    if eps != NORM_EPS:
        raise MadslError(
            f'{path}: "{eps_key}" is {eps!r}; madsl\'s RMSNorms have eps {NORM_EPS:g}, so its logits would differ',
            hint=f"madsl imports {family} checkpoints with {eps_key} 1e-05 (transformers' default)",
        )
    limit = config.get("time_step_limit") or [0.0, math.inf]
    bounds = [config_number(value) for value in limit] if isinstance(limit, list) and len(limit) == 2 else None
    if bounds is None or None in bounds or bounds[0] > 0.0 or bounds[1] < math.inf:
        raise MadslError(
            f'{path}: "time_step_limit" {config.get("time_step_limit")!r} clamps the Mamba-2 step size; '
            "madsl's Mamba-2 does not clamp it, so its logits would differ",
            hint=f"madsl imports {family} checkpoints with time_step_limit [0.0, inf] (transformers' default)",
        )


def config_number(value: Any) -> float | None:
    """A config number as transformers writes it: JSON's, or {"__float__": "Infinity"} for an infinity."""
    if isinstance(value, dict) and set(value) == {"__float__"} and value["__float__"] in ("Infinity", "-Infinity"):
        return math.inf if value["__float__"] == "Infinity" else -math.inf
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
