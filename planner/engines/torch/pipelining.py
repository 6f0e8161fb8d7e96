"""A 3D plan on the ``nn.Module`` itself (``planner export --target torch`` of a pipeline plan): a
Python file that cuts the module into ``torch.distributed.pipelining`` stages at the plan's cuts and
runs them with its schedule, each stage replicated over its data-parallel devices.

The file holds ``SPLIT_POINTS`` (the block that begins each model chunk after the first, a
``SplitPoint.BEGINNING``), ``STAGES``, ``DATA_PARALLEL`` (devices per stage: each replica runs the
pipeline on its share of the batch, and the replicas' gradients are summed once per step),
``NUM_MICROBATCHES``, ``SCHEDULE`` (``GPipe``, ``1F1B`` or ``Interleaved1F1B``), ``CHUNKS`` (model
chunks per device: interleaved:v cuts the module into stages x v chunks, chunk j on pipeline rank j
% stages, each device holding its stage's share of the blocks), ``TIED`` (parameters two stages hold
a copy of, whose gradients are summed between the copies), ``build_stages`` and ``schedule``.
``planner run-torch --plan FILE.py`` trains it (``torch_module_worker``).

A stage plan that splits parameters on one stage-mesh axis (tensor parallelism inside a stage) adds
``TENSOR_PARALLEL`` (that axis' size; the mesh becomes ``("pp", "dp", "tp")``), ``PARAM_PLACEMENTS``
(each parameter's placement on it, a tied parameter's copy in its own stage's layout) and the weight
modules' ``MODULE_INPUT_PLACEMENTS`` / ``OUTPUT_PLACEMENTS`` (as in
``planner.engines.torch.module``): ``parallelize_stage`` distributes the stage's parameters, hooks
the modules, and hands the stage's outputs on as whole tensors (the pipeline sends plain tensors,
each tensor-parallel rank to its peer of the next stage). Refused: tensor parallelism on two
stage-mesh axes, or an axis that splits the batch and a parameter.
"""

from __future__ import annotations

import math

from planner.errors import SettingsError
from planner.engines.torch.module_layouts import (
    module_layouts,
    placements_source,
    project,
    tied_embeddings,
)
from planner.cluster.mesh import parse_mesh
from planner.cluster.profiles import get_profile
from planner.engines.export import export_plan
from planner.engines.torch.module_layouts import module_params
from planner.pipeline.schedule import parse_schedule
from planner.ir.crossing import tied_copies
from planner.engines.predicted import compare, predicted_pipeline_collectives
from planner.cost.strategy import REPLICATE
from planner.engines.torch.module_layouts import input_layout

TEMPLATE = '''"""PyTorch pipelining plan from planner: {title}.

    planner run-torch --plan {{this file}} --nproc {nproc} --steps 5
"""
import torch
from torch.distributed.tensor import Replicate, Shard

MODULE = {module!r}  # planner import-torch spec of the nn.Module
LOSS = {loss!r}
STAGES = {stages}
DATA_PARALLEL = {dp}  # devices per stage: each replica pipelines its share of the batch
SPLIT_POINTS = {split_points!r}  # the block that begins each model chunk after the first
# model chunks per device (interleaved 1F1B): chunk j runs on pipeline rank j % STAGES
CHUNKS = {chunks}
NUM_MICROBATCHES = {count}  # per replica
SCHEDULE = {schedule!r}
TIED = {tied!r}  # (owner, alias): a parameter two stages hold a copy of
# bytes one device of each pipeline rank sends per step, summed, as the 3D cost model charges the
# plan (per mesh dim of this file; "tied": the all-reduce of the tied copies)
PREDICTED_BYTES = {predicted!r}
TENSOR_PARALLEL = {tp}  # devices that split one stage's parameters (1: none)
MESH_DIM_NAMES = ("pp", "dp", "tp") if TENSOR_PARALLEL > 1 else ("pp", "dp")
MESH_SHAPE = (STAGES, DATA_PARALLEL) + ((TENSOR_PARALLEL,) if TENSOR_PARALLEL > 1 else ())
# tensor parallelism inside the stages: each parameter's placement on "tp", and the layouts the
# weight modules' inputs and outputs are redistributed to (forward pre-hook, forward hook)
PARAM_PLACEMENTS = {{{placements}
}}
MODULE_INPUT_PLACEMENTS = {{{module_inputs}
}}
OUTPUT_PLACEMENTS = {{{outputs}
}}


class Logits(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.m = model

    def forward(self, *inputs):
        out = self.m(*inputs)
        return getattr(out, "logits", out)


def build_stages(model, microbatch_inputs, pp_rank, pp_group):
    """This rank's PipelineStages (its CHUNKS model chunks): the module traced and cut at
    SPLIT_POINTS."""
    from torch.distributed.pipelining import SplitPoint, pipeline
    pipe = pipeline(Logits(model), mb_args=tuple(microbatch_inputs),
                    split_spec={{"m." + name: SplitPoint.BEGINNING for name in SPLIT_POINTS}})
    forward_skips(pipe.split_gm)
    return [pipe.build_stage(pp_rank + chunk * STAGES, torch.device("cpu"), group=pp_group)
            for chunk in range(CHUNKS)]


def forward_skips(split_gm):
    """A value a stage reads from a stage before its predecessor (GPT-2's attention mask, made by
    the first stage and read by every block) is handed on by each stage in between: the
    multi-stage runtime only sends between adjacent stages."""
    import operator
    graph = split_gm.graph
    calls = [node for node in graph.nodes
             if node.op == "call_module" and node.target.startswith("submod_")]
    made, relayed = {{call: k for k, call in enumerate(calls)}}, {{}}

    def maker(node):
        if node.op == "call_function" and node.target is operator.getitem:
            node = node.args[0]
        return made.get(node)
    for k, call in enumerate(calls):
        for arg in list(dict.fromkeys(a for a in call.args if isinstance(a, torch.fx.Node))):
            if maker(arg) is None or maker(arg) >= k - 1:
                continue
            value = arg
            for between in calls[maker(arg) + 1:k]:
                # once per value and stage, whoever reads it later
                if (value, between) not in relayed:
                    relayed[value, between] = _hand_on(split_gm, between, value)
                    made[relayed[value, between]] = made[between]
                value = relayed[value, between]
            call.replace_input_with(arg, value)
    split_gm.recompile()


def _hand_on(split_gm, call, value):
    """``call``'s stage returns ``value`` as its last output (taking it as its last input, unless it
    reads it already)."""
    import operator
    graph, sub = split_gm.graph, split_gm.get_submodule(call.target)
    inputs = [node for node in sub.graph.nodes if node.op == "placeholder"]
    if value in call.args:
        handed = inputs[call.args.index(value)]
    else:
        with sub.graph.inserting_after(inputs[-1]):
            handed = sub.graph.placeholder(f"handed_{{len(call.args)}}")
        call.args = call.args + (value,)
    out = next(node for node in sub.graph.nodes if node.op == "output")
    single = not isinstance(out.args[0], (tuple, list))
    outputs = ((out.args[0],) if single else tuple(out.args[0])) + (handed,)
    out.args = (outputs,)
    sub.recompile()
    if single:  # its readers took the stage's one output: now its first
        with graph.inserting_after(call):
            first = graph.call_function(operator.getitem, (call, 0))
        call.replace_all_uses_with(first, delete_user_cb=lambda user: user is not first)
    with graph.inserting_after(call):
        return graph.call_function(operator.getitem, (call, len(outputs) - 1))


def parallelize_stage(stage, tp_mesh):
    """Tensor parallelism inside the stage: its parameters distributed on ``tp_mesh``
    (PARAM_PLACEMENTS), the weight modules hooked, the stage's outputs handed on whole. Run it under
    implicit_replication."""
    from torch.distributed.tensor import DTensor, distribute_tensor
    module = stage.submod
    # torch.export's metadata asserts: DTensor has no sharding rule for them
    for sub in module.modules():
        graph = getattr(sub, "graph", None)
        for node in list(graph.nodes) if isinstance(graph, torch.fx.Graph) else ():
            if node.target is torch.ops.aten._assert_tensor_metadata.default and not node.users:
                graph.erase_node(node)
        if isinstance(sub, torch.fx.GraphModule) and graph is not None:
            sub.recompile()
    for fqn, param in list(module.named_parameters()):
        owner, _, leaf = fqn.rpartition(".")
        placements = PARAM_PLACEMENTS.get(fqn[len("m."):], (Replicate(),))
        distributed = distribute_tensor(param.data, tp_mesh, placements)
        setattr(module.get_submodule(owner), leaf, torch.nn.Parameter(distributed))
    for table, hook in ((MODULE_INPUT_PLACEMENTS, "pre"), (OUTPUT_PLACEMENTS, "post")):
        for fqn, placements in table.items():
            if not _has(module, "m." + fqn):
                continue
            target = module.get_submodule("m." + fqn)
            if hook == "pre":
                target.register_forward_pre_hook(lambda mod, args, p=placements: (
                    args[0].redistribute(tp_mesh, p), *args[1:])
                    if isinstance(args[0], DTensor) else args)
            else:
                target.register_forward_hook(lambda mod, args, out, p=placements:
                                             out.redistribute(tp_mesh, p)
                                             if isinstance(out, DTensor) else out)
    module.register_forward_hook(lambda mod, args, out: tuple(
        o.full_tensor() if isinstance(o, DTensor) else o for o in out) if isinstance(out, tuple)
        else out.full_tensor() if isinstance(out, DTensor) else out)


def _has(module, fqn):
    try:
        module.get_submodule(fqn)
        return True
    except AttributeError:
        return False


def schedule(stages, loss_fn):
    from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B
    # the loss is a sum over the batch: gradients are summed over micro-batches, not averaged
    if SCHEDULE == "Interleaved1F1B":
        return ScheduleInterleaved1F1B(stages, NUM_MICROBATCHES, loss_fn=loss_fn, scale_grads=False)
    flat = ScheduleGPipe if SCHEDULE == "GPipe" else Schedule1F1B
    return flat(stages[0], NUM_MICROBATCHES, loss_fn=loss_fn, scale_grads=False)
'''


def _tensor_parallel_layouts(micro, exported, tp_axes, params, tables, tied) -> tuple:
    """The parameters' placements and the module inputs' and outputs' layouts on the
    tensor-parallel axes of a stage."""
    stage_plan = project(exported, tp_axes)
    leaves = dict(stage_plan.leaves)
    placements = {fqn: placements_source(leaves[fqn]) for fqn in sorted(params) if fqn in leaves}
    shared = {n for pair in tied for n in pair}
    module_inputs, outputs = module_layouts(
        micro, stage_plan, set(), shared, tied_embeddings(params, tables, shared)
    )
    return placements, module_inputs, outputs


def _check_blocks(spec: str, blocks, micro) -> None:
    layers = {op.layer for op in micro.operators if op.layer is not None}
    if len(blocks) != len(layers):
        raise SettingsError(
            f"--target torch: {spec} has {len(blocks)} blocks, the plan's graph {len(layers)} "
            "layers"
        )


def _dict_rows(table: dict) -> str:
    return "".join(f"\n    {name!r}: {value}," for name, value in sorted(table.items()))


def _chunk_bytes(micro, operators, strategies, mesh, tp_axes, starts, pipe: dict):
    """The bytes the 3D cost model charges the plan, its operators placed on their model chunks."""
    chunk_of = {
        o["name"]: _chunk(micro.operator(o["name"]).layer, int(o["stage"]), starts)
        for o in operators
    }
    count = int(pipe["num_microbatches"])
    return predicted_bytes(micro, chunk_of, strategies, mesh, tp_axes, len(starts) + 1, count)


def pipelining_plan(data: dict, micro, spec: str, loss: str, title: str) -> str:
    """The file's text for a 3D plan ``data`` (plan JSON) of a graph imported from ``spec``;
    ``micro`` is the graph at the micro-batch size (``interleaved:v``: ``chunk_starts``). Refuses
    stage plans that are neither data parallel nor tensor parallel on one axis."""
    pipe, operators = data["pipeline"], data["operators"]
    kind, chunks = parse_schedule(str(pipe.get("schedule")).lower())
    schedule = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved": "Interleaved1F1B"}[kind]
    mesh = parse_mesh(pipe["stage_mesh"], get_profile("symbolic"))
    axes = tuple(operators[0]["strategy"]) if operators else ()
    strategies = {o["name"]: tuple(o["strategy"].get(a) for a in axes) for o in operators}
    exported = export_plan(micro, strategies, mesh)
    tp_axes = _tensor_parallel_axes(micro, exported)
    params, _, blocks, tables = module_params(spec)
    _check_blocks(spec, blocks, micro)
    tied = tuple(sorted((owner, fqn) for fqn, (_, owner) in params.items() if fqn != owner))
    placements, module_inputs, outputs = (
        _tensor_parallel_layouts(micro, exported, tp_axes, params, tables, tied)
        if tp_axes
        else ({}, {}, {})
    )
    tp = mesh.shape[tp_axes[0]] if tp_axes else 1
    dp = math.prod(mesh.shape) // tp

    rows = _dict_rows
    starts = chunk_starts([int(c) for c in pipe["cuts"]], len(blocks), chunks)
    predicted = _chunk_bytes(micro, operators, strategies, mesh, tp_axes, starts, pipe)
    return TEMPLATE.format(
        predicted=predicted,
        title=title,
        module=spec,
        loss=loss,
        stages=int(pipe["stages"]),
        dp=dp,
        chunks=chunks,
        split_points=tuple(blocks[start] for start in starts),
        count=int(pipe["num_microbatches"]),
        schedule=schedule,
        tied=tied,
        nproc=int(pipe["stages"]) * math.prod(mesh.shape),
        tp=tp,
        placements=rows(placements),
        module_inputs=rows(module_inputs),
        outputs=rows(outputs),
    )


def chunk_starts(cuts: list[int], blocks: int, chunks: int) -> tuple[int, ...]:
    """The block that begins each model chunk after the first. Stage k's blocks (the plan's cuts)
    are dealt into ``chunks`` near-equal runs; chunk j of the model is run r = j // p of stage k = j
    % p (Megatron-LM's interleaving), so device k holds stage k's share of the blocks, as the time
    model has it. One chunk per device: the plan's cuts. Refused: a stage with fewer blocks than
    chunks."""
    bounds = [0, *cuts, blocks]
    sizes = [bounds[k + 1] - bounds[k] for k in range(len(bounds) - 1)]
    if min(sizes) < chunks:
        raise SettingsError(
            f"--target torch: interleaved:{chunks} deals each stage's blocks into {chunks} model "
            f"chunks; a stage of this plan has {min(sizes)} block(s)"
        )
    runs = [[n // chunks + (1 if r < n % chunks else 0) for r in range(chunks)] for n in sizes]
    out, at = [], 0
    for r in range(chunks):
        for k in range(len(sizes)):
            at += runs[k][r]
            out.append(at)
    return tuple(out[:-1])


def _chunk(layer: int | None, stage: int, starts: tuple[int, ...]) -> int:
    """The model chunk of an operator: by its block, else (embedding, head) the first or the
    last."""
    import bisect

    if layer is None:
        return 0 if stage == 0 else len(starts)
    return bisect.bisect_right(starts, layer)


def predicted_bytes(
    micro,
    chunk_of: dict,
    strategies: dict,
    mesh,
    tp_axes: tuple[int, ...],
    chunks: int,
    num_microbatches: int,
) -> dict[str, float]:
    """``predicted.predicted_pipeline_collectives`` over the model chunks (every chunk boundary a
    send), as bytes each device sends (``predicted.compare``), the stage mesh's axes named as the
    file's mesh dims: ``tp`` the tensor-parallel axis, ``dp`` the others (flattened); ``pp`` and
    ``tied``."""
    transfers = predicted_pipeline_collectives(
        micro, chunk_of, strategies, mesh, chunks, num_microbatches
    )
    copies = tied_copies(micro, chunk_of)
    rows, _ = compare(
        transfers, [], {**dict(zip(mesh.names, mesh.shape)), "pp": chunks, "tied": copies}
    )
    dims = {
        **{name: "tp" if ax in tp_axes else "dp" for ax, name in enumerate(mesh.names)},
        "pp": "pp",
        "tied": "tied",
    }
    out = {"pp": 0.0, "dp": 0.0, **({"tp": 0.0} if tp_axes else {}), "tied": 0.0}
    for row in rows:
        if row.axes in dims:
            out[dims[row.axes]] += round(row.predicted, 1)
    return out


def _tensor_parallel_axes(micro, exported) -> tuple[int, ...]:
    """The stage-mesh axis that splits parameters (none: the stages are data parallel); refused:
    two such axes, or one that also splits the batch."""
    leaves = dict(exported.leaves)
    split = [
        ax
        for ax in range(len(exported.mesh_shape))
        if any(
            layout[ax] != REPLICATE
            for name, layout in leaves.items()
            if micro.tensor(name).role == "param"
        )
    ]
    if len(split) > 1:
        raise SettingsError(
            "--target torch: a pipeline plan's stages are exported with tensor parallelism on one "
            f"stage-mesh axis; this plan splits parameters on {len(split)}"
        )
    batch = input_layout(micro, leaves, len(exported.mesh_shape))
    if split and batch[split[0]] == 0:
        raise SettingsError(
            f"--target torch: stage-mesh axis {exported.axis_names[split[0]]!r} splits both the "
            "batch and parameters, which a pipelining stage cannot run; planner run-torch --plan "
            "PLAN.json runs it as planned"
        )
    return tuple(split)
