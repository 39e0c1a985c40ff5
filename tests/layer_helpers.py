"""Helpers shared by the layer tests: build a primitive's module, count parameters, run step mode."""

from __future__ import annotations

import torch

from madsl.lang.stdlib import primitive


def make(name: str, dim: int, **overrides):
    """(accounting primitive, torch module) for a primitive at the stdlib defaults plus overrides."""
    prim = primitive(name, dim, **overrides)
    return prim, prim.build()


def n_params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def run_steps(module, x: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """The module's recurrent (step) mode over x (batch, L, dim): outputs (batch, L, dim), final state."""
    state = module.init_state(x.shape[0], dtype=x.dtype)
    outputs = []
    for t in range(x.shape[1]):
        y_t, state = module.step(x[:, t], state)
        outputs.append(y_t)
    return torch.stack(outputs, dim=1), state
