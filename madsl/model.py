"""The torch model a spec compiles to: embedding, the topology's blocks, final norm, head.

Wired as its plan says (madsl/compiler.py reads it) from the units of madsl/model_parts.py: a
`Block` per block (its residual adds, its `PreNorm` layers, parallel mixers summed), a
`GroupConnection` per group, a `Fork` per group of branches, in one `Stack`.

Recurrent inference (`Model.init_state`, `step`, `prefill`, `generate`): the state of a
model (with meta tokens: after them) is a list with one entry per stateful layer *use*, in stack order (a tagged layer
used twice is one module with two states). Each entry is that layer's own state dict
(keys as the accounting counts them: "fixed", "conv", "k"/"v"/"cache"). Channel mixers
are position-wise and keep no state.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .model_parts import DEFAULT_NORM_EPS, Stack, State, make_norm, reinit_linears


class Model(nn.Module):
    """tokens (B, L) -> logits (B, L, num_classes)."""

    def __init__(
        self,
        body: list[nn.Module],
        dim: int,
        vocab_size: int,
        num_classes: int,
        norm: str,
        tie_embeddings: bool,
        max_seq_len: int | None = None,
        *,
        positions: int = 0,
        embedding_std: float = 0.02,
        linear_std: float | None = None,
        final_norm: bool = True,
        embedding_norm: bool = False,
        norm_eps: float = DEFAULT_NORM_EPS,
        embedding_scale: float = 1.0,
        logit_divisor: float = 1.0,
        logit_soft_cap: float | None = None,
        embedding_link=None,
        meta_tokens: int = 0,
    ):
        super().__init__()
        self.dim, self.vocab_size, self.num_classes, self.max_seq_len = dim, vocab_size, num_classes, max_seq_len
        self.named_layers: dict[str, list[nn.Module]] = {}  # set by the compiler: symbol or "#tag" -> modules
        self.embedding = nn.Embedding(vocab_size, dim)
        # µP-style multipliers (Granite's embedding_multiplier and logits_scaling); 1.0: none
        self.embedding_scale, self.logit_divisor = embedding_scale, logit_divisor
        self.logit_soft_cap = logit_soft_cap  # cap * tanh(logits / cap) (xLSTM's, Gemma's); None: none
        # `positions` learned absolute positions (GPT-2, GPT-Neo), added to the token embedding; 0: none
        self.positions = nn.Embedding(positions, dim) if positions else None
        # a norm of the token embedding before the first block (RWKV's ln0); None: none
        self.embedding_norm = make_norm(norm, dim, norm_eps) if embedding_norm else None
        self.body = Stack(*body)
        # the stack's input, handed to the layers that read the token embeddings (madsl/layers/zamba.py's
        # EmbeddingLink, set by the compiler); None: no layer reads them
        self.embedding_link = embedding_link
        # learned tokens prepended to every sequence (Hymba's meta tokens); their outputs are dropped
        self.meta_tokens = nn.Parameter(torch.empty(meta_tokens, dim)) if meta_tokens else None
        self.final_norm = make_norm(norm, dim, norm_eps) if final_norm else nn.Identity()
        tied = tie_embeddings and num_classes == vocab_size
        self.head = None if tied else nn.Linear(dim, num_classes, bias=False)
        if linear_std is not None:
            reinit_linears(self.body, linear_std)
        nn.init.normal_(self.embedding.weight, std=embedding_std)  # 0.02: GPT-2 / Transformer++ practice
        if self.positions is not None:
            nn.init.normal_(self.positions.weight, std=embedding_std)
        if self.meta_tokens is not None:
            nn.init.normal_(self.meta_tokens, std=embedding_std)
        if self.head is not None:
            nn.init.normal_(self.head.weight, std=0.02 if linear_std is None else linear_std)

    def __repr__(self) -> str:
        # the one-line summary; `print(model.body)` shows the module tree
        spec = getattr(self, "spec", None)
        name = f"{spec.name!r}, {spec.canonical()!r}, " if spec is not None else ""
        return (
            f"Model({name}dim={self.dim}, vocab={self.vocab_size}, classes={self.num_classes}, "
            f"params={self.num_params():,})"
        )

    def features(self, tokens: torch.Tensor | None = None, embeds: torch.Tensor | None = None) -> torch.Tensor:
        """Hidden states after the final norm (if the model has one), (B, L, dim). Give token ids or input
        embeddings."""
        if (tokens is None) == (embeds is None):
            raise ValueError("give exactly one of tokens or embeds")
        x = self._embed(tokens) if tokens is not None else embeds
        return self.final_norm(self._unmeta(self.body(self._link(self._with_meta(self._add_positions(x))))))

    def _with_meta(self, x: torch.Tensor) -> torch.Tensor:
        """The sequence the stack reads: the meta tokens, then x (B, L, dim)."""
        if self.meta_tokens is None:
            return x
        return torch.cat((self.meta_tokens.to(x.dtype).expand(x.shape[0], -1, -1), x), dim=1)

    def _unmeta(self, h: torch.Tensor) -> torch.Tensor:
        """The stack's outputs at the sequence's own positions (the meta tokens' dropped)."""
        return h if self.meta_tokens is None else h[:, self.meta_tokens.shape[0] :]

    def _link(self, x: torch.Tensor) -> torch.Tensor:
        """The stack's input, handed to the layers that read the embeddings in this call."""
        if self.embedding_link is not None:
            self.embedding_link.value = x
        return x

    def _add_positions(self, x: torch.Tensor, start: int = 0) -> torch.Tensor:
        if self.positions is None:
            return x
        end = start + x.shape[1]
        if end > self.positions.num_embeddings:
            raise ValueError(
                f"position {end - 1} is past the {self.positions.num_embeddings} learned positions "
                f"(positions: learned: the spec's seq_len is the longest sequence)"
            )
        return x + self.positions.weight[start:end]

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self._logits(self.features(tokens))

    def _embed(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embedding(tokens)
        x = x if self.embedding_scale == 1.0 else x * self.embedding_scale
        return x if self.embedding_norm is None else self.embedding_norm(x)

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        logits = F.linear(h, self.embedding.weight) if self.head is None else self.head(h)
        if self.logit_divisor != 1.0:
            logits = logits / self.logit_divisor
        if self.logit_soft_cap is not None:
            logits = self.logit_soft_cap * torch.tanh(logits / self.logit_soft_cap)
        return logits

    # ---- recurrent inference ---------------------------------------------------------------------
    def init_state(
        self, batch: int, device: torch.device | str | None = None, dtype: torch.dtype | None = None
    ) -> State:
        """The empty state of `batch` sequences: one dict per stateful layer use, in stack order."""
        device = device if device is not None else self.embedding.weight.device
        dtype = dtype if dtype is not None else self.embedding.weight.dtype
        out: State = []
        if self.positions is not None:
            out.append({"pos": torch.zeros(batch, dtype=torch.long, device=device)})
        if self.meta_tokens is None:
            self.body.init_state(batch, device, dtype, out)
        else:  # the state after the meta tokens, which every sequence starts with
            with torch.no_grad():
                meta = self.meta_tokens.to(device=device, dtype=dtype).expand(batch, -1, -1)
                self.body.prefill(self._link(meta), out)
        return out

    @torch.no_grad()
    def step(self, tokens: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        """One token per sequence: tokens (B,) -> (logits (B, num_classes), new state).
        The input state is not modified."""
        out: State = []
        states = iter(state)
        x = self._embed(tokens)
        if self.positions is not None:  # learned positions: the state's first entry counts the tokens seen
            pos = next(states)["pos"]
            if int(pos.max()) >= self.positions.num_embeddings:
                raise ValueError(
                    f"position {int(pos.max())} is past the {self.positions.num_embeddings} learned "
                    f"positions (positions: learned)"
                )
            x = x + self.positions(pos)
            out.append({"pos": pos + 1})
        h = self.body.step(self._link(x), states, out)
        if next(states, None) is not None or len(out) != len(state):
            raise ValueError("the state does not belong to this model (use model.init_state or model.prefill)")
        return self._logits(self.final_norm(h)), out

    @torch.no_grad()
    def prefill(self, tokens: torch.Tensor) -> tuple[torch.Tensor, State]:
        """The parallel forward over a prompt, tokens (B, L) -> (logits (B, L, num_classes),
        the state after the prompt); `step` continues from it."""
        out: State = []
        if self.positions is not None:
            out.append({"pos": torch.full((tokens.shape[0],), tokens.shape[1], dtype=torch.long, device=tokens.device)})
        h = self.body.prefill(self._link(self._with_meta(self._add_positions(self._embed(tokens)))), out)
        return self._logits(self.final_norm(self._unmeta(h))), out

    @torch.no_grad()
    def generate(
        self,
        prompt: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Continue prompts (B, L) by `max_new_tokens` tokens: prefill, then one `step` per
        token, sampling from softmax(logits / temperature) (greedy at temperature 0).
        Returns (B, L + max_new_tokens). Needs an output head over the vocabulary."""
        if self.num_classes != self.vocab_size:
            raise ValueError(
                f"generate needs logits over the vocabulary ({self.vocab_size}); "
                f"this model has {self.num_classes} output classes"
            )
        if max_new_tokens < 0 or temperature < 0:
            raise ValueError("max_new_tokens and temperature must not be negative")
        logits, state = self.prefill(prompt)
        logits, tokens = logits[:, -1], [prompt]
        for i in range(max_new_tokens):
            if temperature == 0:
                token = logits.argmax(-1)
            else:
                probs = torch.softmax(logits.float() / temperature, dim=-1)
                token = torch.multinomial(probs, 1, generator=generator)[:, 0]
            tokens.append(token[:, None])
            if i + 1 < max_new_tokens:
                logits, state = self.step(token, state)
        return torch.cat(tokens, dim=1)

    @staticmethod
    def state_size(state: State) -> dict[str, int]:
        """Numbers held per sequence, by the accounting's names: fixed_state, conv_state, kv_cache
        (bookkeeping such as attention's next position is not counted)."""
        kinds = {"fixed": "fixed_state", "conv": "conv_state", "k": "kv_cache", "v": "kv_cache", "cache": "kv_cache"}
        size = {"fixed_state": 0, "conv_state": 0, "kv_cache": 0}
        for layer_state in state:
            for key, value in layer_state.items():
                if key in kinds:
                    size[kinds[key]] += value[0].numel()
        return size

    def aux_loss(self) -> torch.Tensor:
        """Auxiliary losses (MoE load balancing) set by layers in the last forward pass."""
        total = torch.zeros((), device=self.embedding.weight.device)
        for module in self.modules():
            loss = getattr(module, "aux_loss", None)
            if isinstance(loss, torch.Tensor):
                total = total + loss
        return total

    def freeze(self, names: list[str]) -> int:
        """Stop training the layers named by symbol (`Mb`), tag (`#a`) or `embedding`;
        returns how many parameters were frozen. Unknown names raise KeyError."""
        frozen = 0
        for name in names:
            if name == "embedding":
                modules = [self.embedding]
            elif name in self.named_layers:
                modules = self.named_layers[name]
            else:
                known = sorted(self.named_layers) + ["embedding"]
                raise KeyError(f"no layer named {name!r} to freeze; layers: {', '.join(known)}")
            for module in modules:
                for p in module.parameters():
                    if p.requires_grad:
                        p.requires_grad_(False)
                        frozen += p.numel()
        return frozen

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())
