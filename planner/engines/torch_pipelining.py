"""A 3D plan on the ``nn.Module`` itself (``planner export --target torch`` of a pipeline plan): a
Python file that cuts the module into ``torch.distributed.pipelining`` stages at the plan's cuts and
runs them with its schedule, each stage replicated over its data-parallel devices.

The file holds ``SPLIT_POINTS`` (the block that begins each stage after the first, a
``SplitPoint.BEGINNING``), ``STAGES``, ``DATA_PARALLEL`` (devices per stage: each replica runs the
pipeline on its share of the batch, and the replicas' gradients are summed once per step),
``NUM_MICROBATCHES``, ``SCHEDULE`` (``GPipe`` or ``1F1B``), ``TIED`` (parameters two stages hold a
copy of, whose gradients are summed between the copies), ``build_stage`` and ``schedule``.
``planner run-torch --plan FILE.py`` trains it (``torch_module_worker``). Exported only when the
stage plan is data parallel (no parameter split): tensor-parallel stages run as planned with
``planner run-torch --plan P3.json``.
"""

from __future__ import annotations

import math

from planner.errors import SettingsError

TEMPLATE = '''"""PyTorch pipelining plan from planner: {title}.

    planner run-torch --plan {{this file}} --nproc {nproc} --steps 5
"""
import torch

MODULE = {module!r}  # planner import-torch spec of the nn.Module
LOSS = {loss!r}
STAGES = {stages}
DATA_PARALLEL = {dp}  # devices per stage: each replica pipelines its share of the batch
SPLIT_POINTS = {split_points!r}  # the block that begins each stage after the first
NUM_MICROBATCHES = {count}  # per replica
SCHEDULE = {schedule!r}
TIED = {tied!r}  # (owner, alias): a parameter two stages hold a copy of
MESH_DIM_NAMES = ("pp", "dp")
MESH_SHAPE = (STAGES, DATA_PARALLEL)


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


def schedule(stage, loss_fn):
    from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe
    # the loss is a sum over the batch: gradients are summed over micro-batches, not averaged
    return (ScheduleGPipe if SCHEDULE == "GPipe" else Schedule1F1B)(stage, NUM_MICROBATCHES, loss_fn=loss_fn,
                                                                    scale_grads=False)
'''


def pipelining_plan(data: dict, micro, spec: str, loss: str, title: str) -> str:
    """The file's text for a 3D plan ``data`` (plan JSON) of a graph imported from ``spec``; ``micro``
    is the graph at the micro-batch size. Refuses tensor-parallel stages and interleaved schedules."""
    from planner.cluster.mesh import parse_mesh
    from planner.cluster.profiles import get_profile
    from planner.cost.strategy import REPLICATE
    from planner.engines.export import export_plan
    from planner.engines.torch_module import _module_params
    pipe, operators = data["pipeline"], data["operators"]
    schedule = {"gpipe": "GPipe", "1f1b": "1F1B"}.get(str(pipe.get("schedule")).lower())
    if schedule is None:
        raise SettingsError(f"--target torch: schedule {pipe.get('schedule')!r} is not exported (GPipe, 1F1B)")
    mesh = parse_mesh(pipe["stage_mesh"], get_profile("symbolic"))
    axes = tuple(operators[0]["strategy"]) if operators else ()
    strategies = {o["name"]: tuple(o["strategy"].get(a) for a in axes) for o in operators}
    leaves = export_plan(micro, strategies, mesh).leaves
    split = sorted(name for name, layout in leaves if micro.tensor(name).role == "param" and set(layout) != {REPLICATE})
    if split:
        raise SettingsError(f"--target torch: a pipeline plan is exported when its stages are data parallel "
                            f"(parameter {split[0]!r} is split); planner run-torch --plan PLAN.json runs it as planned")
    params, _, blocks = _module_params(spec)
    layers = {op.layer for op in micro.operators if op.layer is not None}
    if len(blocks) != len(layers):
        raise SettingsError(f"--target torch: {spec} has {len(blocks)} blocks, the plan's graph {len(layers)} layers")
    tied = tuple(sorted((owner, fqn) for fqn, (_, owner) in params.items() if fqn != owner))
    return TEMPLATE.format(title=title, module=spec, loss=loss, stages=int(pipe["stages"]), dp=math.prod(mesh.shape),
                           split_points=tuple(blocks[cut] for cut in pipe["cuts"]), count=int(pipe["num_microbatches"]),
                           schedule=schedule, tied=tied, nproc=int(pipe["stages"]) * math.prod(mesh.shape))


def run_worker(plan, job: dict, out_path: str) -> None:
    """One torchrun rank of an exported pipelining plan: stage ``rank // DATA_PARALLEL``, replica
    ``rank % DATA_PARALLEL``; SGD steps with the plan's schedule, the replicas' and the tied copies'
    gradients summed once per step. Rank 0 writes the per-step losses (summed over replicas)."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh

    from planner.engines.torch_module_worker import _model_and_batch
    mesh = init_device_mesh("cpu", (plan.STAGES, plan.DATA_PARALLEL), mesh_dim_names=("pp", "dp"))
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
        if stage_index == 0:
            schedule.step(*inputs, target=targets if last else None, losses=mine if last else None)
        elif last:
            schedule.step(target=targets, losses=mine)
        else:
            schedule.step()
        params = dict(stage.submod.named_parameters())
        with torch.no_grad():
            for value in params.values():
                if value.grad is not None:
                    dist.all_reduce(value.grad, group=mesh.get_group("dp"))
            for name, group in tied:
                dist.all_reduce(params[name].grad, group=group)
            for value in params.values():
                if value.grad is not None:
                    value -= job["lr"] * value.grad
                    value.grad = None
        total = torch.tensor(float(sum(float(v) for v in mine)))
        dist.all_reduce(total)
        losses.append(float(total))
    if dist.get_rank() == 0:
        from planner.outputs import write_json
        write_json(out_path, {"losses": losses, "transfers": [], "backend": "gloo"})


def _tied_groups(plan, stage, dist) -> list:
    """(this stage's name of a tied copy, the group of the ranks holding its copies at this replica)."""
    names = {name for name, _ in stage.submod.named_parameters()}
    held = [[f"m.{n}" for pair in plan.TIED for n in pair if f"m.{n}" in names]]
    every: list = [None] * dist.get_world_size()
    dist.all_gather_object(every, held[0])
    out = []
    for owner, alias in plan.TIED:
        for replica in range(plan.DATA_PARALLEL):
            ranks = [r for r in range(dist.get_world_size()) if r % plan.DATA_PARALLEL == replica
                     and {f"m.{owner}", f"m.{alias}"} & set(every[r])]
            group = dist.new_group(ranks) if len(ranks) > 1 else None
            mine = [n for n in (f"m.{owner}", f"m.{alias}") if n in names]
            if group is not None and dist.get_rank() in ranks and mine:
                out.append((mine[0], group))
    return out
