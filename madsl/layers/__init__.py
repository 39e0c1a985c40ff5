"""The torch side of the layer primitives: one module per file.

Every layer module is built as `Cls(dim=..., **hyperparameters)` with exactly the
hyperparameters of its accounting class in `madsl/primitives/<name>.py`, and
`sum(p.numel() for p in module.parameters())` equals that class's `params()`.

Sequence mixers (and Mamba) follow one protocol:

    forward(x: Tensor[B, L, D]) -> Tensor[B, L, D]                 # parallel (training) form, causal
    init_state(batch: int, device=None, dtype=None) -> dict[str, Tensor]
    step(x_t: Tensor[B, D], state: dict) -> tuple[Tensor[B, D], dict]   # one token, inference form

Running `step` token by token from `init_state` gives the same outputs as
`forward`. The state dict names what it holds: "fixed" is the recurrent state
(numel per sequence == the accounting's fixed_state), "conv" the short
convolution's buffer (== conv_state), "k"/"v" attention's KV cache (together
== kv_cache at the current length). Channel mixers only implement forward.

A module may set `self.aux_loss` (a scalar tensor, already weighted) in forward;
the model adds it to the training loss (MoE load balancing).
"""
