"""The plan's layouts at an ``nn.Module``'s boundaries, as an exported PyTorch file states them
(``planner.engines.torch.module``, ``planner.engines.torch.pipelining``): the module's parameters
and blocks, placements as source text, parallelize_module styles, the layouts the weight modules'
hooks put their inputs and outputs in, and the gradient walks of parameters reduced over several
axes.
"""

from __future__ import annotations
from planner.cost.strategy import GRAD_PARTIAL, PARTIAL, REPLICATE
from planner.engines.torch.presets import build_spec
from planner.cost.redistribution import hierarchical_layouts
from planner.cost.strategy import forward_layout


def placements_source(layout, partial: bool = False) -> str:
    """Placements source text of a layout (one placement per mesh dim; Partial kept if
    ``partial``)."""
    parts = [
        "Partial()"
        if partial and p in (PARTIAL, GRAD_PARTIAL)
        else "Replicate()"
        if p in (REPLICATE, PARTIAL)
        else f"Shard({p})"
        for p in layout
    ]
    return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"


def module_params(spec: str):
    """The module's parameters built on the meta device: path -> (shape, owner path of the shared
    tensor); its nn.Linear paths; its blocks (the items of its containers); and per shared tensor's
    owner path, the nn.Embedding that reads it (a tied table)."""
    import torch

    with torch.device("meta"):
        module, _, _ = build_spec(spec)
    first, out = {}, {}
    for fqn, param in module.named_parameters(remove_duplicate=False):
        out[fqn] = (tuple(param.shape), first.setdefault(id(param), fqn))
    linear = {name for name, sub in module.named_modules() if isinstance(sub, torch.nn.Linear)}
    blocks = tuple(
        f"{name}.{child}"
        for name, sub in module.named_modules()
        if isinstance(sub, torch.nn.ModuleList)
        for child, _ in sub.named_children()
    )
    tables = {
        first[id(sub.weight)]: name
        for name, sub in module.named_modules()
        if isinstance(sub, torch.nn.Embedding) and id(sub.weight) in first
    }
    return out, linear, blocks, tables


def gradient_steps(graph, exported, params: dict, shared: set, styled: set) -> tuple:
    """Per parameter read once, in its own layout, whose gradient the plan reduces over two or more
    mesh axes: the placements of the cost model's hierarchical all-reduce (``hierarchical_steps``:
    reduce-scatters on the inner axes over the largest local dim that divides, the all-reduce on the
    outer axis, all-gathers back), as source text, from the Partial gradient to the parameter's
    layout."""
    mesh_shape, leaves = exported.mesh_shape, dict(exported.leaves)
    reads: dict[str, list] = {}
    for op, slot, layout in exported.inputs:
        reads.setdefault(graph.operator(op).inputs[slot].tensor, []).append(layout)
    out = []
    for fqn in sorted(params):
        layouts = reads.get(fqn, ())
        if (
            fqn not in leaves
            or fqn in shared
            or fqn.rpartition(".")[0] in styled
            or len(layouts) != 1
        ):
            continue
        read = layouts[0]
        axes = [ax for ax, p in enumerate(read) if p == GRAD_PARTIAL and mesh_shape[ax] > 1]
        if len(axes) < 2 or forward_layout(read) != leaves[fqn]:
            continue
        walk = hierarchical_layouts(graph.tensor(fqn).shape, read, axes, mesh_shape)
        if walk is None:
            continue
        steps = [placements_source(layout, partial=True) for layout in [read, *walk]]
        out.append((fqn, tuple(steps)))
    return tuple(out)


def project(exported, axes: tuple[int, ...]):
    """The plan's layouts on the mesh axes ``axes`` only (the tensor-parallel sub-mesh)."""
    from dataclasses import replace

    def on(layout):
        return tuple(layout[ax] for ax in axes)

    return replace(
        exported,
        axis_names=tuple(exported.axis_names[ax] for ax in axes),
        mesh_shape=tuple(exported.mesh_shape[ax] for ax in axes),
        leaves=tuple((name, on(layout)) for name, layout in exported.leaves),
        inputs=tuple((op, slot, on(layout)) for op, slot, layout in exported.inputs),
        outputs=tuple((op, slot, on(layout)) for op, slot, layout in exported.outputs),
    )


def tied_embeddings(params: dict, tables: dict, shared: set) -> dict[str, str]:
    """Per path of a shared tensor, the nn.Embedding that reads it (the IR names a tied table by one
    of its paths, which may be the LM head's)."""
    return {
        fqn: tables[owner]
        for fqn, (_, owner) in params.items()
        if fqn in shared and owner in tables
    }


def _weight_of(graph, op) -> str | None:
    """The ``.weight`` parameter an operator reads beside its input (its module's), if any."""
    return next(
        (
            o.tensor
            for o in op.inputs[1:]
            if o.tensor.endswith(".weight") and graph.tensor(o.tensor).role == "param"
        ),
        None,
    )


def _read_after_views(op, readers: dict, inputs: dict) -> set:
    """The layouts an operator's output is read in, past the reshapes that only view it."""
    tensor = op.outputs[0].tensor
    while len(readers.get(tensor, ())) == 1 and readers[tensor][0][0].kind == "reshape":
        tensor = readers[tensor][0][0].outputs[0].tensor
    return {forward_layout(inputs[(reader.name, slot)]) for reader, slot in readers.get(tensor, ())}


def module_layouts(
    graph, exported, styled: set, shared: set, embeddings: dict | None = None
) -> tuple[dict[str, str], dict[str, str]]:
    """Per weight module without a style (GPT-2's Conv1D, a Linear no style fits): the layout the
    plan reads its input in, and the one its output's readers all take (past the module's own
    reshapes), as placements source: (inputs, outputs). A tied table the plan splits gets its
    lookup's output layout too (``embeddings``: table path -> its nn.Embedding): left to DTensor,
    the vocabulary-parallel lookup's partial sum was reduce-scattered into the residual stream, and
    every LayerNorm gathered it back (Megatron on 2x4: +35% of the plan's bytes, now +3.4%)."""
    leaves = dict(exported.leaves)
    inputs = {(op, slot): layout for op, slot, layout in exported.inputs}
    readers: dict[str, list] = {}
    producer = {o.tensor: op for op in graph.operators for o in op.outputs}
    for op in graph.operators:
        for slot, operand in enumerate(op.inputs):
            readers.setdefault(operand.tensor, []).append((op, slot))
    ins, outs = {}, {}
    for op in graph.operators:
        weight = _weight_of(graph, op)
        module = weight[: -len(".weight")] if weight else None
        if (
            op.kind == "embedding"
            and weight in (embeddings or {})
            and set(leaves[weight]) != {REPLICATE}
        ):
            module = embeddings[weight]
        elif module is None or module in styled or weight in shared or len(readers[weight]) != 1:
            continue
        first, tensor = op, op.inputs[0].tensor
        if tensor in producer and producer[tensor].kind == "reshape" and len(readers[tensor]) == 1:
            first = producer[tensor]  # the module flattens its input itself (Conv1D's view)
        read = _read_before_view(
            graph,
            first,
            op,
            forward_layout(inputs[(first.name, 0)]),
            forward_layout(inputs[(op.name, 0)]),
        )
        if graph.tensor(first.inputs[0].tensor).role == "activation":
            ins[module] = placements_source(read)
        layouts = _read_after_views(op, readers, inputs)
        if len(layouts) == 1 and PARTIAL not in next(iter(layouts)):
            outs[module] = placements_source(next(iter(layouts)))
    return ins, outs


def _read_before_view(graph, view, op, before: tuple, after: tuple) -> tuple:
    """The module's input layout: what the view reads (``before``), except an axis where the plan
    slices the flattened input's last dim only at ``op`` (``after``): that axis splits the input's
    last dim (the same slice, taken at the hook), so DTensor multiplies the shards as planned
    (row-parallel: a partial sum) instead of gathering the weight."""
    if view is op:
        return before
    last_in = len(graph.tensor(view.inputs[0].tensor).shape) - 1
    last_out = len(graph.tensor(view.outputs[0].tensor).shape) - 1
    return tuple(last_in if b == REPLICATE and a == last_out else b for b, a in zip(before, after))


def input_layout(graph, leaves: dict, naxes: int):
    """Batch split of the module's inputs: where the plan splits the labels' (else the first data's)
    dim 0."""
    data = [t.name for t in graph.tensors if t.role == "data" and t.name in leaves]
    name = "labels" if "labels" in data else (data[0] if data else None)
    if name is None:
        return (REPLICATE,) * naxes
    return tuple(0 if p == 0 else REPLICATE for p in leaves[name])


def styles_of(graph, exported, linear: set, shared: set, leaves: dict) -> dict[str, str]:
    """Colwise / rowwise styles for the nn.Linear layers whose layouts are a style's (1-D mesh)."""
    inputs = {(op, slot): layout for op, slot, layout in exported.inputs}
    outputs = {(op, slot): layout for op, slot, layout in exported.outputs}
    styles = {}
    for op in graph.operators:
        names = [operand.tensor for operand in op.inputs]
        module = next(
            (
                n[: -len(".weight")]
                for n in names
                if n.endswith(".weight") and n[: -len(".weight")] in linear
            ),
            None,
        )
        if module is None or f"{module}.weight" in shared or graph.tensor(names[0]).role == "param":
            continue
        weight = leaves[f"{module}.weight"][0]
        x = forward_layout(inputs[(op.name, 0)])[0]
        out = outputs[(op.name, 0)][0]
        x_last, out_last = (
            len(graph.tensor(names[0]).shape) - 1,
            len(graph.tensor(op.outputs[0].tensor).shape) - 1,
        )
        if weight == 0 and x == REPLICATE and out == out_last:
            styles[module] = (
                "ColwiseParallel(input_layouts=Replicate(), output_layouts=Shard(-1), "
                "use_local_output=False)"
            )
        elif weight == 1 and x == x_last and out in (REPLICATE, PARTIAL):
            styles[module] = (
                "RowwiseParallel(input_layouts=Shard(-1), output_layouts=Replicate(), "
                "use_local_output=False)"
            )
    return styles
