"""A 3D plan on the ``nn.Module`` itself (``planner export --target torch`` of a pipeline plan): a
Python file that cuts the module into ``torch.distributed.pipelining`` stages at the plan's cuts and
runs them with its schedule, each stage replicated over its data-parallel devices.

The file holds ``SPLIT_POINTS`` (the block that begins each stage after the first, a
``SplitPoint.BEGINNING``), ``STAGES``, ``DATA_PARALLEL`` (devices per stage: each replica runs the
pipeline on its share of the batch, and the replicas' gradients are summed once per step),
``NUM_MICROBATCHES``, ``SCHEDULE`` (``GPipe`` or ``1F1B``), ``TIED`` (parameters two stages hold a
copy of, whose gradients are summed between the copies), ``build_stage`` and ``schedule``.
``planner run-torch --plan FILE.py`` trains it (``torch_module_worker``).

A stage plan that splits parameters on one stage-mesh axis (tensor parallelism inside a stage) adds
``TENSOR_PARALLEL`` (that axis' size; the mesh becomes ``("pp", "dp", "tp")``), ``PARAM_PLACEMENTS``
(each parameter's placement on it, a tied parameter's copy in its own stage's layout) and the weight
modules' ``MODULE_INPUT_PLACEMENTS`` / ``OUTPUT_PLACEMENTS`` (as in ``planner.engines.torch_module``):
``parallelize_stage`` distributes the stage's parameters, hooks the modules, and hands the stage's
outputs on as whole tensors (the pipeline sends plain tensors, each tensor-parallel rank to its peer
of the next stage). Refused: tensor parallelism on two stage-mesh axes, or an axis that splits the
batch and a parameter.
"""

from __future__ import annotations

import contextlib
import math

from planner.errors import SettingsError

TEMPLATE = '''"""PyTorch pipelining plan from planner: {title}.

    planner run-torch --plan {{this file}} --nproc {nproc} --steps 5
"""
import torch
from torch.distributed.tensor import Replicate, Shard

MODULE = {module!r}  # planner import-torch spec of the nn.Module
LOSS = {loss!r}
STAGES = {stages}
DATA_PARALLEL = {dp}  # devices per stage: each replica pipelines its share of the batch
SPLIT_POINTS = {split_points!r}  # the block that begins each stage after the first
NUM_MICROBATCHES = {count}  # per replica
SCHEDULE = {schedule!r}
TIED = {tied!r}  # (owner, alias): a parameter two stages hold a copy of
TENSOR_PARALLEL = {tp}  # devices that split one stage's parameters (1: none)
MESH_DIM_NAMES = ("pp", "dp", "tp") if TENSOR_PARALLEL > 1 else ("pp", "dp")
MESH_SHAPE = (STAGES, DATA_PARALLEL, TENSOR_PARALLEL) if TENSOR_PARALLEL > 1 else (STAGES, DATA_PARALLEL)
# tensor parallelism inside the stages: each parameter's placement on "tp", and the layouts the weight
# modules' inputs and outputs are redistributed to (forward pre-hook, forward hook)
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


def build_stage(model, microbatch_inputs, stage_index, pp_group):
    """This rank's PipelineStage: the module traced and cut at SPLIT_POINTS."""
    from torch.distributed.pipelining import SplitPoint, pipeline
    pipe = pipeline(Logits(model), mb_args=tuple(microbatch_inputs),
                    split_spec={{"m." + name: SplitPoint.BEGINNING for name in SPLIT_POINTS}})
    return pipe.build_stage(stage_index, torch.device("cpu"), group=pp_group)


def parallelize_stage(stage, tp_mesh):
    """Tensor parallelism inside the stage: its parameters distributed on ``tp_mesh`` (PARAM_PLACEMENTS),
    the weight modules hooked, the stage's outputs handed on whole. Run it under implicit_replication."""
    from torch.distributed.tensor import DTensor, distribute_tensor
    module = stage.submod
    for sub in module.modules():  # torch.export's metadata asserts: DTensor has no sharding rule for them
        graph = getattr(sub, "graph", None)
        for node in list(graph.nodes) if isinstance(graph, torch.fx.Graph) else ():
            if node.target is torch.ops.aten._assert_tensor_metadata.default and not node.users:
                graph.erase_node(node)
        if isinstance(sub, torch.fx.GraphModule) and graph is not None:
            sub.recompile()
    for fqn, param in list(module.named_parameters()):
        owner, _, leaf = fqn.rpartition(".")
        placements = PARAM_PLACEMENTS.get(fqn[len("m."):], (Replicate(),))
        setattr(module.get_submodule(owner), leaf, torch.nn.Parameter(distribute_tensor(param.data, tp_mesh, placements)))
    for table, hook in ((MODULE_INPUT_PLACEMENTS, "pre"), (OUTPUT_PLACEMENTS, "post")):
        for fqn, placements in table.items():
            if not _has(module, "m." + fqn):
                continue
            target = module.get_submodule("m." + fqn)
            if hook == "pre":
                target.register_forward_pre_hook(lambda mod, args, p=placements: (
                    args[0].redistribute(tp_mesh, p), *args[1:]) if isinstance(args[0], DTensor) else args)
            else:
                target.register_forward_hook(lambda mod, args, out, p=placements:
                                             out.redistribute(tp_mesh, p) if isinstance(out, DTensor) else out)
    module.register_forward_hook(lambda mod, args, out: tuple(
        o.full_tensor() if isinstance(o, DTensor) else o for o in out) if isinstance(out, tuple)
        else out.full_tensor() if isinstance(out, DTensor) else out)


def _has(module, fqn):
    try:
        module.get_submodule(fqn)
        return True
    except AttributeError:
        return False


def schedule(stage, loss_fn):
    from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe
    # the loss is a sum over the batch: gradients are summed over micro-batches, not averaged
    return (ScheduleGPipe if SCHEDULE == "GPipe" else Schedule1F1B)(stage, NUM_MICROBATCHES, loss_fn=loss_fn,
                                                                    scale_grads=False)
'''


def pipelining_plan(data: dict, micro, spec: str, loss: str, title: str) -> str:
    """The file's text for a 3D plan ``data`` (plan JSON) of a graph imported from ``spec``; ``micro``
    is the graph at the micro-batch size. Refuses interleaved schedules and stage plans that are
    neither data parallel nor tensor parallel on one axis."""
    from planner.cluster.mesh import parse_mesh
    from planner.cluster.profiles import get_profile
    from planner.engines.export import export_plan
    from planner.engines.torch_module import _module_layouts, _module_params, _project, _source
    pipe, operators = data["pipeline"], data["operators"]
    schedule = {"gpipe": "GPipe", "1f1b": "1F1B"}.get(str(pipe.get("schedule")).lower())
    if schedule is None:
        raise SettingsError(f"--target torch: schedule {pipe.get('schedule')!r} is not exported (GPipe, 1F1B)")
    mesh = parse_mesh(pipe["stage_mesh"], get_profile("symbolic"))
    axes = tuple(operators[0]["strategy"]) if operators else ()
    strategies = {o["name"]: tuple(o["strategy"].get(a) for a in axes) for o in operators}
    exported = export_plan(micro, strategies, mesh)
    tp_axes = _tensor_parallel_axes(micro, exported)
    params, _, blocks = _module_params(spec)
    layers = {op.layer for op in micro.operators if op.layer is not None}
    if len(blocks) != len(layers):
        raise SettingsError(f"--target torch: {spec} has {len(blocks)} blocks, the plan's graph {len(layers)} layers")
    tied = tuple(sorted((owner, fqn) for fqn, (_, owner) in params.items() if fqn != owner))
    placements, module_inputs, outputs = {}, {}, {}
    if tp_axes:
        stage_plan = _project(exported, tp_axes)
        leaves = dict(stage_plan.leaves)
        placements = {fqn: _source(leaves[fqn]) for fqn in sorted(params) if fqn in leaves}
        module_inputs, outputs = _module_layouts(micro, stage_plan, set(), {n for pair in tied for n in pair})
    tp = mesh.shape[tp_axes[0]] if tp_axes else 1
    dp = math.prod(mesh.shape) // tp

    def rows(table: dict) -> str:
        return "".join(f"\n    {name!r}: {value}," for name, value in sorted(table.items()))
    return TEMPLATE.format(title=title, module=spec, loss=loss, stages=int(pipe["stages"]), dp=dp,
                           split_points=tuple(blocks[cut] for cut in pipe["cuts"]), count=int(pipe["num_microbatches"]),
                           schedule=schedule, tied=tied, nproc=int(pipe["stages"]) * math.prod(mesh.shape), tp=tp,
                           placements=rows(placements), module_inputs=rows(module_inputs), outputs=rows(outputs))


def _tensor_parallel_axes(micro, exported) -> tuple[int, ...]:
    """The stage-mesh axis that splits parameters (none: the stages are data parallel); refused:
    two such axes, or one that also splits the batch."""
    from planner.cost.strategy import REPLICATE
    from planner.engines.torch_module import _input_layout
    leaves = dict(exported.leaves)
    split = [ax for ax in range(len(exported.mesh_shape)) if any(
        layout[ax] != REPLICATE for name, layout in leaves.items() if micro.tensor(name).role == "param")]
    if len(split) > 1:
        raise SettingsError("--target torch: a pipeline plan's stages are exported with tensor parallelism on one "
                            f"stage-mesh axis; this plan splits parameters on {len(split)}")
    batch = _input_layout(micro, leaves, len(exported.mesh_shape))
    if split and batch[split[0]] == 0:
        raise SettingsError(f"--target torch: stage-mesh axis {exported.axis_names[split[0]]!r} splits both the "
                            "batch and parameters, which a pipelining stage cannot run; planner run-torch --plan "
                            "PLAN.json runs it as planned")
    return tuple(split)


def run_worker(plan, job: dict, out_path: str) -> None:
    """One torchrun rank of an exported pipelining plan: stage ``rank // DATA_PARALLEL``, replica
    ``rank % DATA_PARALLEL``; SGD steps with the plan's schedule, the replicas' and the tied copies'
    gradients summed once per step. Rank 0 writes the per-step losses (summed over replicas)."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh

    from planner.engines.torch_module_worker import _model_and_batch
    tensor_parallel = getattr(plan, "TENSOR_PARALLEL", 1)
    mesh = init_device_mesh("cpu", tuple(plan.MESH_SHAPE), mesh_dim_names=tuple(plan.MESH_DIM_NAMES))
    stage_index, replica = mesh.get_local_rank("pp"), mesh.get_local_rank("dp")
    model, batch, generator = _model_and_batch(plan, job["seed"])
    with torch.no_grad():
        shape = plan.Logits(model)(*[value[:1] for value in batch]).shape
    labels = torch.randint(0, shape[-1], (batch[0].shape[0],) + tuple(shape[1:-1]), generator=generator)
    share = batch[0].shape[0] // plan.DATA_PARALLEL
    rows = slice(replica * share, (replica + 1) * share)
    inputs, targets = [value[rows] for value in batch], labels[rows]
    micro = share // plan.NUM_MICROBATCHES
    stage = plan.build_stage(model, [value[:micro] for value in inputs], stage_index, mesh.get_group("pp"))
    context = contextlib.nullcontext
    if tensor_parallel > 1:
        from torch.distributed.tensor.experimental import implicit_replication
        plan.parallelize_stage(stage, mesh["tp"])
        context = implicit_replication
    counts = tensor_parallel == 1 or mesh.get_local_rank("tp") == 0  # one loss per replica

    def loss_fn(out, target):
        if plan.LOSS == "sum":
            return out.sum()
        return F.cross_entropy(out.reshape(-1, out.shape[-1]), target.reshape(-1), reduction="sum")
    schedule = plan.schedule(stage, loss_fn)
    tied = _tied_groups(plan, stage, dist)
    last = stage_index == plan.STAGES - 1
    losses = []
    for _ in range(job["steps"]):
        mine: list = []
        with context():
            if stage_index == 0:
                schedule.step(*inputs, target=targets if last else None, losses=mine if last else None)
            elif last:
                schedule.step(target=targets, losses=mine)
            else:
                schedule.step()
        _update(stage, tied, mesh.get_group("dp"), job["lr"])
        total = torch.tensor(float(sum(float(v) for v in mine)) if counts else 0.0)
        dist.all_reduce(total)
        losses.append(float(total))
    if dist.get_rank() == 0:
        from planner.outputs import write_json
        write_json(out_path, {"losses": losses, "transfers": [], "backend": "gloo"})


def _update(stage, tied: list, dp_group, lr: float) -> None:
    """SGD on the stage's parameters: gradients summed over the replicas (a tensor-parallel shard
    with its peers) and between tied copies (whole: the copies' layouts may differ), then applied."""
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor, distribute_tensor
    params = dict(stage.submod.named_parameters())
    with torch.no_grad():
        for value in params.values():
            if value.grad is not None:
                dist.all_reduce(value.grad.to_local() if isinstance(value.grad, DTensor) else value.grad, group=dp_group)
        for name, group in tied:
            grad = params[name].grad
            whole = grad.full_tensor() if isinstance(grad, DTensor) else grad
            dist.all_reduce(whole, group=group)
            if isinstance(grad, DTensor):
                params[name].grad = distribute_tensor(whole, grad.device_mesh, grad.placements)
        for value in params.values():
            if value.grad is not None:
                value -= lr * value.grad
                value.grad = None


def _tied_groups(plan, stage, dist) -> list:
    """(this stage's name of a tied copy, the group of the ranks holding its copies at this replica)."""
    names = {name for name, _ in stage.submod.named_parameters()}
    held = [[f"m.{n}" for pair in plan.TIED for n in pair if f"m.{n}" in names]]
    every: list = [None] * dist.get_world_size()
    dist.all_gather_object(every, held[0])
    out = []
    width = plan.DATA_PARALLEL * getattr(plan, "TENSOR_PARALLEL", 1)  # ranks of one stage: (replica, tp peer)
    for owner, alias in plan.TIED:
        for replica in range(width):
            ranks = [r for r in range(dist.get_world_size()) if r % width == replica
                     and {f"m.{owner}", f"m.{alias}"} & set(every[r])]
            group = dist.new_group(ranks) if len(ranks) > 1 else None
            mine = [n for n in (f"m.{owner}", f"m.{alias}") if n in names]
            if group is not None and dist.get_rank() in ranks and mine:
                out.append((mine[0], group))
    return out
