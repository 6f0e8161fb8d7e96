"""A flat plan on the ``nn.Module`` itself (``planner export --target torch``): a Python file with a
``parallelize_module`` plan and every parameter's DTensor placements, which ``planner run-torch``
(``planner.engines.torch.module_worker``) trains under torchrun.

What the file holds, from the plan's layouts (``planner.engines.export``):
- ``PARALLELIZE_PLAN``: on a 1-D mesh, ``ColwiseParallel`` / ``RowwiseParallel`` for every
  ``nn.Linear`` whose weight the plan splits on its output / input features and whose input and
  output layouts are the style's (replicated in and last dim split out for colwise; last dim split
  in,
  reduced out for rowwise), with the plan's layouts as the style's ``input_layouts`` /
  ``output_layouts``. Styles take a 1-D mesh, so a plan on a 2-D mesh has none.
- ``PARAM_PLACEMENTS``: every other parameter's placements, one per mesh dim (its first reader's
  layout), applied with ``distribute_tensor``; a parameter shared by two modules (a tied embedding)
  is distributed once, in its owner's layout.
- ``INPUT_PLACEMENTS``: the module's inputs (and labels) split on the batch where the plan splits
  it.
- ``MODULE_INPUT_PLACEMENTS`` / ``OUTPUT_PLACEMENTS``: per weight module without a style, the
  layouts
  its input and its output are redistributed to (forward pre-hook, forward hook): where the plan
  reads the input, and where all readers of the output take it. Without them DTensor keeps its own
  propagation's layouts (Megatron on 8 ranks then failed to unflatten 4 heads of a split
  ``c_attn``).
The module then runs in DTensor: the placements above are the plan's, the activations between them
are what DTensor's sharding propagation derives (so its collectives can differ from the cost
model's edges; ``planner run-torch --plan PLAN.json`` runs every edge as the plan says).
- ``FULLY_SHARD_MODULES``: a ZeRO-3 plan runs as FSDP2: ``fully_shard`` on every block of the
  module's ``ModuleList``s, then the root, gradients summed (the loss is a sum over the batch), on
  ``FULLY_SHARD_DIM_NAMES``: the mesh axes where the plan splits the batch and keeps every parameter
  whole, which is where the cost model shards a ZeRO-3 parameter (several: flattened, not HSDP). The
  other axes (one at most) are tensor parallel: the styles, placements and hooks above on that
  sub-mesh first, then FSDP2 on top (torchtitan's FSDP + TP). The inputs are each rank's batch
  block.
The layouts at the module's boundaries are worked out in ``planner.engines.torch.module_layouts``.
3D plans are
exported as ``torch.distributed.pipelining`` stages (``planner.engines.torch.pipelining``).
Not exported (refused with a one-line reason): ZeRO-3 plans with no such axis, with tensor
parallelism on two axes, or splitting an activation on a data-parallel axis other than by its batch;
plans whose graph was not imported from a module.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from planner.engines.torch.module_layouts import (
    gradient_steps,
    input_layout,
    module_layouts,
    module_params,
    placements_source,
    project,
    styles_of,
    tied_embeddings,
)
from planner.errors import SettingsError
from planner.engines.export import export_plan
from planner.cost.settings import TrainingSettings
from planner.engines.predicted import compare, predicted_collectives
from planner.cost.strategy import GRAD_PARTIAL, PARTIAL, REPLICATE

TEMPLATE = '''"""PyTorch plan from planner: {title}.

Load inside a torchrun process (gloo on CPU, nccl on GPUs):
    mesh = init_device_mesh("cpu", MESH_SHAPE, mesh_dim_names=MESH_DIM_NAMES)
    model = parallelize(model, mesh)
and run forward and backward under torch.distributed.tensor.experimental.implicit_replication()
(tensors the model creates itself, such as position ids, are then replicated), the inputs placed
with INPUT_PLACEMENTS (with FULLY_SHARD_MODULES: plain tensors, each rank its batch block). Or:
    planner run-torch --plan {{this file}} --nproc {nproc} --steps 5
"""
from torch.distributed.tensor import Partial, Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

MODULE = {module!r}  # planner import-torch spec of the nn.Module
LOSS = {loss!r}
MESH_DIM_NAMES = {names!r}
MESH_SHAPE = {shape!r}
# parallelize_module styles (1-D meshes: nn.Linear whose layouts are a style's)
PARALLELIZE_PLAN = {{{styles}
}}
# every other parameter: DTensor placements, one per mesh dim
PARAM_PLACEMENTS = {{{placements}
}}
# the input and output of these weight modules, redistributed (forward pre-hook, forward hook) to
# the plan's layouts: the module's own read, and the one its readers take; DTensor would otherwise
# keep its propagation's layouts, and the gradients come back through the same redistributions
MODULE_INPUT_PLACEMENTS = {{{module_inputs}
}}
OUTPUT_PLACEMENTS = {{{outputs}
}}
# parameters whose gradient is Partial over several mesh dims: reduced as the plan prices it (a
# reduce-scatter on the inner dims, the all-reduce on the outer, all-gathers back), one placement
# change per step; DTensor would all-reduce the whole buffer once per mesh dim
GRADIENT_STEPS = {{{gradient_steps}
}}
# ZeRO-3: FSDP2's fully_shard on these blocks, then the root, over FULLY_SHARD_DIM_NAMES (several:
# flattened); the other mesh dims are tensor parallel (the styles and placements above are theirs,
# applied first). The inputs are this rank's batch block (INPUT_PLACEMENTS' block), the loss a
# local sum
FULLY_SHARD_MODULES = {fully_shard!r}
FULLY_SHARD_DIM_NAMES = {fully_shard_dims!r}
# the module's inputs and labels
INPUT_PLACEMENTS = {inputs}
# bytes each device sends per step, per mesh axis, as the cost model charges the plan's edges
PREDICTED_BYTES = {predicted!r}


def tensor_parallel_mesh(mesh):
    """The sub-mesh of the styles and placements: the mesh dims FSDP2 does not shard on."""
    names = tuple(name for name in MESH_DIM_NAMES if name not in FULLY_SHARD_DIM_NAMES)
    return mesh[names] if names else None


def fully_sharded_mesh(mesh):
    """FSDP2's mesh: FULLY_SHARD_DIM_NAMES, flattened when several (torchtitan's dp mesh)."""
    names = tuple(FULLY_SHARD_DIM_NAMES)
    if len(names) == 1:
        return mesh[names[0]]
    return (mesh if names == tuple(MESH_DIM_NAMES) else mesh[names])._flatten("dp")


def parallelize(model, mesh):
    """PARALLELIZE_PLAN through parallelize_module, PARAM_PLACEMENTS through distribute_tensor and
    the module hooks (on the tensor-parallel sub-mesh of a ZeRO-3 plan); then fully_shard."""
    if not FULLY_SHARD_MODULES:
        return _tensor_parallel(model, mesh)
    from torch.distributed.fsdp import FSDPModule, fully_shard
    tp_mesh = tensor_parallel_mesh(mesh)
    if tp_mesh is not None:
        model = _tensor_parallel(model, tp_mesh)
    dp_mesh = fully_sharded_mesh(mesh)
    for name in FULLY_SHARD_MODULES:
        fully_shard(model.get_submodule(name), mesh=dp_mesh)
    # ZeRO-3 as planned: gathered in both passes
    fully_shard(model, mesh=dp_mesh, reshard_after_forward=True)
    # the loss is a sum over the batch: sum the gradients, do not average
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)
    return model


def _tensor_parallel(model, mesh):
    import torch
    from torch.distributed.tensor import DTensor, distribute_tensor
    from torch.distributed.tensor.parallel import parallelize_module
    if PARALLELIZE_PLAN:
        parallelize_module(model, mesh, PARALLELIZE_PLAN)
    done = {{}}
    for fqn, param in list(model.named_parameters(remove_duplicate=False)):
        owner, _, leaf = fqn.rpartition(".")
        if id(param) not in done:
            placements = PARAM_PLACEMENTS.get(fqn, (Replicate(),) * mesh.ndim)
            done[id(param)] = param if isinstance(param, DTensor) else torch.nn.Parameter(
                distribute_tensor(param.data, mesh, placements))
        setattr(model.get_submodule(owner), leaf, done[id(param)])
    for fqn, placements in MODULE_INPUT_PLACEMENTS.items():
        model.get_submodule(fqn).register_forward_pre_hook(
            lambda module, args, placements=placements:
                (args[0].redistribute(mesh, placements), *args[1:])
                if isinstance(args[0], DTensor) else args)
    for fqn, placements in OUTPUT_PLACEMENTS.items():
        model.get_submodule(fqn).register_forward_hook(
            lambda module, args, out, placements=placements:
                out.redistribute(mesh, placements) if isinstance(out, DTensor) else out)
    for fqn, steps in GRADIENT_STEPS.items():
        model.get_parameter(fqn).register_hook(lambda grad, steps=steps: _walk(grad, mesh, steps))
    return model


def _walk(grad, mesh, steps):
    """The gradient through the planned steps (left to DTensor if it is not in the first one)."""
    if tuple(grad.placements) != steps[0]:
        return grad
    for placements in steps[1:]:
        grad = grad.redistribute(mesh, placements)
    return grad
'''


@dataclass(frozen=True, slots=True)
class ModulePlan:
    """What the exported file says: the module, the mesh, styles, placements (as source text)."""

    module: str
    loss: str
    axis_names: tuple[str, ...]
    mesh_shape: tuple[int, ...]
    styles: tuple[tuple[str, str], ...]  # (module path, style constructor source)
    placements: tuple[tuple[str, str], ...]  # (parameter path, placements tuple source)
    inputs: str
    predicted: tuple[tuple[str, float], ...]
    title: str
    fully_shard: tuple[str, ...] = ()  # ZeRO-3: the blocks fully_shard wraps (then the root)
    fully_shard_dims: tuple[str, ...] = ()  # ZeRO-3: the mesh axes FSDP2 shards on
    # (module path, placements its output is redistributed to)
    outputs: tuple[tuple[str, str], ...] = ()
    # (module path, placements its input is redistributed to)
    module_inputs: tuple[tuple[str, str], ...] = ()
    # (parameter path, placements of each step)
    gradient_steps: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def render(self) -> str:
        """The plan as a Python file."""
        styles = "".join(f"\n    {name!r}: {style}," for name, style in self.styles)
        placements = "".join(f"\n    {name!r}: {value}," for name, value in self.placements)
        outputs = "".join(f"\n    {name!r}: {value}," for name, value in self.outputs)
        module_inputs = "".join(f"\n    {name!r}: {value}," for name, value in self.module_inputs)
        walks = "".join(
            f"\n    {name!r}: ({', '.join(steps)})," for name, steps in self.gradient_steps
        )
        return TEMPLATE.format(
            title=self.title,
            module=self.module,
            loss=self.loss,
            names=self.axis_names,
            shape=self.mesh_shape,
            styles=styles,
            placements=placements,
            inputs=self.inputs,
            predicted=dict(self.predicted),
            nproc=math.prod(self.mesh_shape),
            fully_shard=self.fully_shard,
            fully_shard_dims=self.fully_shard_dims,
            outputs=outputs,
            module_inputs=module_inputs,
            gradient_steps=walks,
        )


def module_plan(
    graph, strategies: dict, mesh, spec: str, loss: str, title: str, zero=0
) -> ModulePlan:
    """The exported plan of a flat plan whose graph was imported from ``spec``; ``zero`` 3 (the plan
    runs ZeRO-3) becomes FSDP2's ``fully_shard`` on the data-parallel axes, over tensor parallelism
    on the others."""
    if zero not in (0, 1, 2, 3):
        raise SettingsError(
            f"--target torch: ZeRO stages per layer (zero {zero!r}) are not exported"
        )
    exported = export_plan(graph, strategies, mesh)
    params, linear, blocks, tables = _checked_params(graph, spec)
    fsdp_axes = _fully_shard_axes(graph, exported) if zero == 3 else ()
    tp_axes = tuple(ax for ax in range(len(mesh.shape)) if ax not in fsdp_axes)
    inputs = placements_source(input_layout(graph, dict(exported.leaves), len(mesh.shape)))
    # the styles, placements and hooks: the tensor-parallel sub-mesh
    exported = project(exported, tp_axes)
    leaves = dict(exported.leaves)
    by_owner = {owner: fqn for fqn, (_, owner) in params.items() if fqn in leaves}
    # every path of a tensor two modules share (a tied embedding: the owner and its alias); a style
    # would distribute the alias on its own and untie it
    owners = {owner for fqn, (_, owner) in params.items() if fqn != owner}
    shared = owners | {fqn for fqn, (_, owner) in params.items() if owner in owners}
    styles = styles_of(graph, exported, linear, shared, leaves) if len(tp_axes) == 1 else {}
    placements = _param_placements(params, leaves, by_owner, styles) if tp_axes else []
    predicted = _predicted_bytes(graph, strategies, mesh, bool(fsdp_axes))
    embeddings = tied_embeddings(params, tables, shared)
    module_inputs, outputs = (
        module_layouts(graph, exported, set(styles), shared, embeddings) if tp_axes else ({}, {})
    )
    walks = gradient_steps(graph, exported, params, shared, set(styles))
    return ModulePlan(
        spec,
        loss,
        tuple(mesh.names),
        tuple(mesh.shape),
        tuple(sorted(styles.items())),
        tuple(placements),
        inputs,
        predicted,
        title,
        fully_shard=blocks if fsdp_axes else (),
        fully_shard_dims=tuple(mesh.names[ax] for ax in fsdp_axes),
        outputs=tuple(sorted(outputs.items())),
        module_inputs=tuple(sorted(module_inputs.items())),
        gradient_steps=walks,
    )


def _checked_params(graph, spec: str) -> tuple:
    """The module's parameters (``module_params``); every parameter of the graph must be one."""
    params, linear, blocks, tables = module_params(spec)
    missing = sorted(t.name for t in graph.tensors if t.role == "param" and t.name not in params)
    if missing:
        raise SettingsError(
            f"--module: {spec} has no parameter {missing[0]!r} of the plan's graph ({len(missing)} "
            "missing): export the plan of a graph imported from this module"
        )
    return params, linear, blocks, tables


def _param_placements(params: dict, leaves: dict, by_owner: dict, styles: dict) -> list:
    """DTensor placements of the parameters no style distributes (an alias takes its owner's)."""
    placements = []
    for fqn, (_, owner) in sorted(params.items()):
        ir_name = fqn if fqn in leaves else by_owner.get(owner)
        if fqn.rpartition(".")[0] in styles or ir_name is None:
            continue
        placements.append((fqn, placements_source(leaves[ir_name])))
    return placements


def _predicted_bytes(graph, strategies: dict, mesh, fully_sharded: bool) -> tuple:
    """Bytes per mesh axis the cost model predicts for one step (fp32, SGD, the file's ZeRO)."""
    zero = 3 if fully_sharded else 0
    settings = TrainingSettings(dtype="fp32", optimizer="sgd", zero=zero, recompute=False)
    collectives = predicted_collectives(graph, strategies, mesh, settings)
    rows, _ = compare(collectives, [], dict(zip(mesh.names, mesh.shape)))
    return tuple((row.axes, round(row.predicted, 1)) for row in rows if row.axes != "total")


def _fully_shard_axes(graph, exported) -> tuple[int, ...]:
    """The mesh axes FSDP2 shards a ZeRO-3 plan on: every parameter whole there and the batch split
    (where the cost model shards a ZeRO-3 parameter). Refused: none, tensor parallelism on two axes,
    or an activation split there on another dim than its batch."""
    leaves = dict(exported.leaves)
    batch = input_layout(graph, leaves, len(exported.mesh_shape))
    axes = tuple(
        ax
        for ax in range(len(exported.mesh_shape))
        if batch[ax] == 0
        and all(
            layout[ax] == REPLICATE
            for name, layout in leaves.items()
            if graph.tensor(name).role == "param"
        )
    )
    if not axes:
        raise SettingsError(
            "--target torch: a ZeRO-3 plan is exported as fully_shard on the mesh axes where it "
            "splits the batch and keeps every parameter whole; this plan has none (planner "
            "run-torch --plan PLAN.json runs it as planned)"
        )
    if len(exported.mesh_shape) - len(axes) > 1:
        raise SettingsError(
            "--target torch: FSDP2 composes with tensor parallelism on one mesh axis; this ZeRO-3 "
            f"plan splits parameters on {len(exported.mesh_shape) - len(axes)}"
        )
    for op, slot, layout in exported.inputs + exported.outputs:
        bad = [ax for ax in axes if layout[ax] not in (0, REPLICATE, PARTIAL, GRAD_PARTIAL)]
        if bad:
            raise SettingsError(
                f"--target torch: the ZeRO-3 plan splits operator {op!r}'s operand {slot} on "
                f"data-parallel axis {exported.axis_names[bad[0]]!r} by another dim than the "
                "batch, which FSDP2 cannot run"
            )
    return axes
