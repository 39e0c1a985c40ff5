"""Spec -> torch.nn.Module, by walking the plan the accounting reads (`madsl.graph.build_graph`).

The plan's graph is the one description of the model: each layer is built by the resolved
primitive its node holds (`Primitive.build()`), so a layer's module and its accounting come from
the same object, and the nesting and wiring are read from its edges: a block's parts and their
residual adds from its join nodes, a group's sub-stack, branches and connection from its entry,
splitter, combiner and exit nodes. Weight sharing: a node that a "shares" edge reaches reuses
the layer module built for the tag's first use (and its pre-norm, as a block's part).
"""

from __future__ import annotations

import os
from pathlib import Path

import networkx as nx
import torch
from torch import nn

from .errors import MadslError
from .graph import build_graph
from .lang.spec import Spec, load_spec
from .model import Model
from .model_parts import Block, Fork, GroupConnection, Inject, Parallel, PreNorm, Stack, make_norm, reinit_linears
from .structure import sources, targets

MODEL_FORMAT = "madsl-model/2"  # config.json's tag (madsl-model/1: a torch.save pickle, no longer read)


class _Compiler:
    """Builds the modules of a plan (`madsl.graph.build_graph`) from its graph.

    The residual stream is read backwards, from the head: every node that ends a unit of it
    says what the unit is and where it starts (a block's last residual add: the block, which
    starts at its first add's residual input; a group's exit: the group, which starts at its
    entry). The units are then built forwards, in stack order, so that initialisation draws its
    random numbers in the order the model's layers stand."""

    def __init__(self, spec: Spec, plan: nx.DiGraph):
        self.spec, self.plan = spec, plan
        self.dim = plan.graph["dim"]
        # the layer module of each tag's first use (every node a "shares" edge reaches reuses it),
        # and the pre-norm unit around it once a use outside a parallel block asked for one
        self.layers: dict[str, nn.Module] = {}
        self.units: dict[str, PreNorm] = {}
        # every built layer module under the names `freeze` accepts: its symbol and "#tag"
        self.named: dict[str, list[nn.Module]] = {}
        # (depth, module, std) of each group with a `linear_std`, applied after the model-wide init, outer first
        self.group_inits: list[tuple[int, nn.Module, float]] = []
        # every layer module with the node of its first use, in stack order (the order they are built)
        self.built: list[tuple[str, nn.Module]] = []
        self.embedding_link = None  # the token embeddings, for layers that read them (`link_embeddings`)
        # the layer module each layer node runs (a tag's later uses: the first's, or their own with per-use parts)
        self.module_of: dict[str, nn.Module] = {}

    # ---- reading the graph -------------------------------------------------------------------

    def input(self, node: str, kind: str) -> str:
        """The one node that feeds `node` along an edge of `kind`."""
        (source,) = sources(self.plan, node, kind)
        return source

    def joins(self, end: str) -> list[str]:
        """A block's residual adds in stack order, given its last: each adds to the output of
        the one before it (the first, to the block's input)."""
        block = self.plan.nodes[end]["block"]
        joins = [end]
        while True:
            source = self.input(joins[-1], "residual")
            if self.plan.nodes[source]["kind"] != "add" or self.plan.nodes[source]["block"] != block:
                return joins[::-1]
            joins.append(source)

    def start(self, end: str) -> str:
        """Where the unit of the stream that ends at `end` starts (the node whose output it reads)."""
        if self.plan.nodes[end]["kind"] == "add":
            return self.input(self.joins(end)[0], "residual")
        return self.input(self.plan.nodes[end]["entry"], "data")

    # ---- layers ------------------------------------------------------------------------------

    def layer(self, node: str) -> nn.Module:
        """The layer module a node's primitive builds."""
        layer = self.plan.nodes[node]["layer"]
        try:
            module = self.plan.nodes[node]["primitive"].build()
        except (ValueError, RuntimeError) as err:  # a combination the module cannot realise
            raise self.spec.topology_error(
                MadslError(f"{layer.symbol} cannot be compiled: {err}"), layer.span
            ) from None
        module.madsl_primitive = self.plan.nodes[node]["primitive"].name  # what a recipe's parameter groups read
        return self.register(node, module)

    def register(self, node: str, module: nn.Module) -> nn.Module:
        """A built layer module, in stack order and under the names `freeze` accepts."""
        layer = self.plan.nodes[node]["layer"]
        self.built.append((node, module))
        self.named.setdefault(layer.symbol, []).append(module)
        if layer.tag is not None:
            self.named.setdefault(f"#{layer.tag}", []).append(module)
        return module

    def first_use(self, node: str) -> str:
        """The node of the tag's first use where this node repeats a tag, else the node itself."""
        first = sources(self.plan, node, "shares")
        return first[0] if first else node

    def prenorm_layer(self, node: str) -> PreNorm:
        """A block's part: the layer with its pre-norm. A tag shares the whole unit among its uses
        as a block's part; where its first such use follows uses as parallel branches (which read
        their block's norm), the unit gets its own norm around the shared layer."""
        first = self.first_use(node)
        if first not in self.units:
            norm = make_norm(self.plan.nodes[node]["norm"], self.dim, self.spec.norm_eps)
            self.units[first] = PreNorm(norm, self.bare_layer(node))
        elif hasattr(self.units[first].layer, "another_use"):  # per-use parts: the norm shared, the use its own
            return PreNorm(self.units[first].norm, self.bare_layer(node))
        self.module_of[node] = self.units[first].layer
        return self.units[first]

    def bare_layer(self, node: str) -> nn.Module:
        """The layer alone (a parallel branch: the block owns the norm; an injector), shared by its tag's
        uses; a layer with per-use parts (Zamba2's shared block: `another_use`) gives each later use its own
        parts around the shared ones."""
        first = self.first_use(node)
        if first not in self.layers:
            self.layers[first] = self.layer(node)
        elif first != node and hasattr(self.layers[first], "another_use"):
            module = self.layers[first].another_use()
            module.madsl_primitive = self.layers[first].madsl_primitive
            self.module_of[node] = self.register(node, module)
            return module
        self.module_of[node] = self.layers[first]
        return self.layers[first]

    def parallel(self, node: str) -> Parallel:
        """Parallel mixers (a sum node): the block's one pre-norm, then each branch."""
        norm = make_norm(self.plan.nodes[node]["norm"], self.dim, self.spec.norm_eps)
        return Parallel(norm, [self.bare_layer(branch) for branch in sources(self.plan, node, "branch")])

    # ---- the residual stream -----------------------------------------------------------------

    def block(self, end: str) -> Block:
        """The block whose last residual add is `end`: each part (the layer or the parallel
        mixers that feed a join) under its join's `part` name, joined as the join's kind says."""
        parts, factors = [], []
        for join in self.joins(end):
            data = self.plan.nodes[join]
            source = self.input(join, "data")
            injector = [self.bare_layer(node) for node in sources(self.plan, source, "inject")]  # built first
            module = self.parallel(source) if self.plan.nodes[source]["kind"] == "sum" else self.prenorm_layer(source)
            if injector:
                module = Inject(injector[0], module)
            parts.append((data["part"], module, data["kind"]))
            factors.append(self.factors(source))
        return Block(parts, self.spec.residual_scale, factors, self.spec.postnorm)

    def factors(self, source: str) -> tuple[float, float]:
        """(alpha, beta) of the part whose layer (or parallel mixers) is `source`: the spec's
        residual_factors of its symbol; parallel mixers share one residual, so none of them may have any."""
        if self.plan.nodes[source]["kind"] != "sum":
            return self.spec.residual_factors.get(self.plan.nodes[source]["layer"].symbol, (1.0, 1.0))
        for branch in sources(self.plan, source, "branch"):
            layer = self.plan.nodes[branch]["layer"]
            if self.spec.residual_factors.get(layer.symbol, (1.0, 1.0)) != (1.0, 1.0):
                raise self.spec.topology_error(
                    MadslError(
                        f"{layer.symbol} has residual_factors, but it is one of parallel mixers, which share "
                        "their block's residual",
                        hint=f"leave {layer.symbol} out of residual_factors, or give it a block of its own",
                    ),
                    layer.span,
                )
        return (1.0, 1.0)

    def group(self, exit_node: str, depth: int) -> nn.Module:
        """The group whose exit is `exit_node`, `depth` groups deep (a branch of a group of
        branches counts as one): its sub-stack (a Stack), or its branches (a Fork of one Stack
        each), inside its connection where it has one."""
        entry = self.plan.nodes[exit_node]["entry"]
        attrs = self.plan.nodes[entry]["attrs"]
        inner = self.input(exit_node, "data")
        if "branches" in attrs:  # inner is the combiner; each branch runs from the splitter to it
            (split,) = targets(self.plan, entry, "data")
            branches = [Stack(*self.sequence(end, split, depth + 2)) for end in sources(self.plan, inner, "branch")]
            members: list[nn.Module] = [Fork(branches, attrs["split"], attrs["combine"], self.dim)]
        else:
            members = self.sequence(inner, entry, depth + 1)
        residual = attrs["residual"]
        if residual != "none":
            module: nn.Module = GroupConnection(members, residual, self.dim)
        else:
            module = members[0] if "branches" in attrs else Stack(*members)
        if "linear_std" in attrs:
            self.group_inits.append((depth, module, float(attrs["linear_std"])))
        return module

    def sequence(self, end: str, start: str, depth: int) -> list[nn.Module]:
        """The units of the stream after `start` up to `end`, built in stack order."""
        ends, node = [], end
        while node != start:
            ends.append(node)
            node = self.start(node)
        return [
            self.block(node) if self.plan.nodes[node]["kind"] == "add" else self.group(node, depth)
            for node in reversed(ends)
        ]

    def body(self) -> list[nn.Module]:
        """The model's body: the units between the embedding and the final norm (or the head)."""
        last = self.input("final_norm" if "final_norm" in self.plan else "head", "data")
        body = self.sequence(last, "embedding", 0)
        self.link_value_residuals()
        self.link_embeddings()
        self.link_shared_keys()
        return body

    def link_shared_keys(self) -> None:
        """Hymba's cross-layer KV sharing: an `Hb` layer with kv_reuse reads the keys and values of the
        nearest Hb layer before it that computes its own, in the same forward, step or prefill (one `KVLink`
        a producer; a producer used again by its tag writes at each use, so a consumer reads its nearest)."""
        hymba = [node for node in self.module_of if self.plan.nodes[node]["primitive"].name == "hymba"]
        if not hymba:
            return
        from .layers.hymba import KVLink

        producer = None
        for node in hymba:  # in stack order
            module, layer = self.module_of[node], self.plan.nodes[node]["layer"]
            if not self.plan.nodes[node]["primitive"].kv_reuse:
                producer = module
                if module.kv_source is None:
                    module.kv_source = KVLink()
            elif producer is None:
                raise self.spec.topology_error(
                    MadslError(
                        f"{layer.symbol} has kv_reuse, but no Hb layer before it computes the keys and values "
                        "it would read",
                        hint="kv_reuse: false on the first Hb layer (Hymba's producers)",
                    ),
                    layer.span,
                )
            else:
                module.kv_from = producer.kv_source

    def link_embeddings(self) -> None:
        """Layers that read the model's token embeddings (Zamba2's shared block: concat(h, e)) get the one
        `EmbeddingLink` the model sets at the start of every forward, step and prefill."""
        readers = [module for _, module in self.built if hasattr(module, "embeddings")]
        if readers:
            from .layers.zamba import EmbeddingLink

            self.embedding_link = EmbeddingLink()
            for module in readers:
                module.embeddings = self.embedding_link

    def link_value_residuals(self) -> None:
        """RWKV-7's value residual: the model's first R7 layer hands its values to every later R7 layer with
        value_residual, in the same forward, step or prefill (one `ValueLink`; the first runs before them,
        as the stack runs in the order its layers are built). A value_residual layer with no R7 before it
        has no first layer's values, and a first layer shared by a tag would hand over another use's values."""
        r7 = [(node, module) for node, module in self.built if module.madsl_primitive == "rwkv7"]
        if not any(module.v_lora is not None for _, module in r7):
            return
        from .layers.rwkv7 import ValueLink

        node, first = r7[0]
        layer = self.plan.nodes[node]["layer"]
        if first.v_lora is not None:
            raise self.spec.topology_error(
                MadslError(
                    f"{layer.symbol} has value_residual, but no R7 layer comes before it to give the first "
                    "layer's values",
                    hint="value_residual: false on the model's first R7 layer (RWKV-7's layer 0)",
                ),
                layer.span,
            )
        if targets(self.plan, node, "shares"):
            raise self.spec.topology_error(
                MadslError(
                    f"{layer.symbol} is the first R7 layer, whose values later R7 layers with value_residual read, "
                    "and it is used again by its tag: a later use would hand over its own values",
                    hint="give the first R7 layer no tag, or use the tag only once",
                ),
                layer.span,
            )
        link = first.value_source = ValueLink()
        for _, module in r7[1:]:
            if module.v_lora is not None:
                module.value_first = link


def compile_spec(
    spec: Spec | str | Path,
    *,
    vocab_size: int | None = None,
    max_seq_len: int | None = None,
    num_classes: int | None = None,
    device: str | torch.device | None = None,
    seed: int = 0,
) -> Model:
    """Build the torch model of a spec. Initialisation is deterministic in `seed`; the layers of
    the spec's `init:` then take their saved weights (and frozen ones stop training)."""
    if not isinstance(spec, Spec):
        spec = load_spec(spec)
    vocab_size = vocab_size or spec.vocab
    if vocab_size is None:
        raise MadslError(
            f"{spec.name}: compiling needs a vocabulary size", hint="pass vocab_size=..., or set `vocab:` in the spec"
        )
    # the plan: every layer resolved and validated (roles, tags: located errors) before anything is built
    plan = build_graph(spec, seq_len=max_seq_len or spec.seq_len, vocab=vocab_size)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        compiler = _Compiler(spec, plan)
        body = compiler.body()
        model = Model(
            body,
            spec.dim,
            vocab_size,
            num_classes or vocab_size,
            spec.norm,
            spec.tie_embeddings,
            max_seq_len or spec.seq_len,
            positions=spec.seq_len if spec.positions == "learned" else 0,
            embedding_std=spec.embedding_std,
            linear_std=spec.linear_std,
            final_norm="final_norm" in plan,
            embedding_norm=spec.embedding_norm,
            norm_eps=spec.norm_eps,
            embedding_scale=spec.embedding_scale,
            logit_divisor=spec.logit_divisor,
            logit_soft_cap=spec.logit_soft_cap,
            embedding_link=compiler.embedding_link,
            meta_tokens=spec.meta_tokens,
        )
        for _, module, std in sorted(compiler.group_inits, key=lambda entry: entry[0]):
            reinit_linears(module, std)
    model.spec = spec
    model.plan = plan  # the graph the model was built from (`madsl compile --emit dot` draws it)
    model.named_layers = compiler.named
    if spec.init and not any(p.is_meta for p in model.parameters()):  # shapes-only builds read no weights
        from madsl.weights.init import apply_init

        apply_init(model, spec, load)
    if device is not None:
        model = model.to(device)
    return model


def saved_spec_data(spec: Spec) -> dict:
    """The spec data a saved model records: without `init:`, whose weights the saved ones include
    (a saved model is read without its spec's file, so it names no files to read)."""
    return {key: value for key, value in spec.data.items() if key != "init"}


def save(model: Model, path: str | os.PathLike, *, option: str = "save") -> Path:
    """Write `model` into the folder `path` (made if missing) in madsl's model file format
    (madsl/model_file.py): model.safetensors (its state dict) and config.json (its spec and
    build arguments), each atomically; nothing else in the folder is touched. `load` builds it
    again, bit for bit. `option` names the path in errors (the CLI's `-o`). Returns the folder."""
    from .model_file import FILES, write_files
    from .outputs import check_output_dir

    folder = check_output_dir(
        path, option, lambda name: name in FILES, force=True, writes="model.safetensors and config.json"
    )
    config = {
        "format": MODEL_FORMAT,
        "spec": saved_spec_data(model.spec),
        "build": {"vocab_size": model.vocab_size, "num_classes": model.num_classes, "max_seq_len": model.max_seq_len},
    }
    folder.mkdir(parents=True, exist_ok=True)
    write_files(folder, model.state_dict(), config, "madsl.compiler.save")
    return folder


def load(path: str | os.PathLike, *, device: str | torch.device | None = None) -> Model:
    """The model `save` wrote into the folder `path`, with its weights. Both files are read as
    untrusted input (checked before anything is allocated); a model file in the pickle format
    madsl once wrote is refused with a MadslError saying how to convert it, never unpickled."""
    from .model_file import ModelReader, old_pickle, pickle_error

    path = Path(path)
    if (pickled := old_pickle(path)) is not None:
        raise pickle_error(pickled, "a model saved by an older madsl")
    if path.is_file():
        raise MadslError(
            f"{path}: not a saved madsl model",
            hint="a model saved by madsl.compiler.save is a folder holding model.safetensors and config.json",
        )
    reader = ModelReader(
        path, MODEL_FORMAT, "a saved madsl model", "madsl.compiler.save", "save the model again", "madsl.compiler.load"
    )
    config = reader.config()
    build = config["build"]
    for key in ("vocab_size", "num_classes", "max_seq_len"):
        reader.integer(build, key, 1)
    spec = reader.spec(config)
    model = reader.load(
        lambda: compile_spec(
            spec, vocab_size=build["vocab_size"], num_classes=build["num_classes"], max_seq_len=build["max_seq_len"]
        )
    )
    return model.to(device) if device is not None else model
