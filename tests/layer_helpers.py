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


def model_steps(model, tokens: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """A whole model's step mode from its initial state over tokens (batch, L): logits
    (batch, L, vocab), final state."""
    state, logits = model.init_state(tokens.shape[0]), []
    for t in range(tokens.shape[1]):
        step_logits, state = model.step(tokens[:, t], state)
        logits.append(step_logits)
    return torch.stack(logits, dim=1), state
