"""One torchrun rank of an exported pipelining file (``planner.engines.torch.pipelining``): its
pipeline rank's model chunks built from the file, SGD steps under the file's schedule, the replicas'
and the tied copies' gradients summed once per step.

The first step's transfers are recorded as the file's ``PREDICTED_BYTES`` counts them, per mesh dim
of the file (``pp``, ``dp``, ``tp``) and ``tied``, one device of each pipeline rank summed:
DTensor's collectives inside a stage (``CommDebugMode``), the sends of the stage's outputs and of
its inputs' gradients (``p2p`` on ``pp``, from the stage module's hooks: the runtime's
point-to-point operations are not dispatched through a mode), the replicas' gradient all-reduce and
the tied copies' (c10d's own, recorded where they run).
"""

from __future__ import annotations

import contextlib

from planner.engines.torch.counting import counting_mode
from planner.engines.torch.plan_files import model_and_batch


def run_worker(plan, job: dict, mesh) -> dict | None:
    """One torchrun rank of an exported pipelining plan on the file's device ``mesh``: pipeline rank
    ``pp``, replica ``dp``; SGD steps with the plan's schedule. Rank 0 returns the per-step losses
    (summed over replicas) and the first step's transfers (one device of each pipeline rank); the
    other ranks None."""
    import torch
    import torch.distributed as dist

    tensor_parallel = getattr(plan, "TENSOR_PARALLEL", 1)
    stages, schedule, inputs, targets, context = _build(plan, job, mesh)
    tied = _tied_groups(plan, stages, dist)
    groups = {}
    if tensor_parallel > 1:
        groups[mesh.get_group("tp").group_name] = (
            ("tp",),
            dist.get_process_group_ranks(mesh.get_group("tp")),
        )
    pp_rank, last = mesh.get_local_rank("pp"), mesh.get_local_rank("pp") == plan.STAGES - 1
    counts = tensor_parallel == 1 or mesh.get_local_rank("tp") == 0  # one loss per replica
    losses, transfers = [], []
    for step in range(job["steps"]):
        record = counting_mode(groups) if step == 0 else None
        hooks = _count_sends(stages, record) if record is not None else []
        mine: list = []
        with context(), record if record is not None else contextlib.nullcontext():
            if pp_rank == 0:
                schedule.step(
                    *inputs, target=targets if last else None, losses=mine if last else None
                )
            elif last:
                schedule.step(target=targets, losses=mine)
            else:
                schedule.step()
        for hook in hooks:
            hook.remove()
        _update(stages, tied, mesh.get_group("dp"), job["lr"], record)
        total = torch.tensor(float(sum(float(v) for v in mine)) if counts else 0.0)
        dist.all_reduce(total)
        losses.append(float(total))
        transfers = record.transfers if record is not None else transfers
    return _rank0_result(mesh, tensor_parallel, losses, transfers)


def _rank0_result(mesh, tensor_parallel: int, losses: list, transfers: list) -> dict | None:
    """Rank 0's result: the losses and the transfers of one device of each pipeline rank."""
    import torch.distributed as dist

    one_device = mesh.get_local_rank("dp") == 0 and (
        tensor_parallel == 1 or mesh.get_local_rank("tp") == 0
    )
    every: list = [None] * dist.get_world_size()
    dist.all_gather_object(every, transfers if one_device else [])
    if dist.get_rank() != 0:
        return None
    return {
        "losses": losses,
        "transfers": [(k, list(a), n) for part in every for k, a, n in part],
        "backend": "gloo",
    }


def _build(plan, job: dict, mesh):
    """This rank's stages (tensor parallel inside, if the file says so), its schedule, its replica's
    inputs and labels, and the context forward and backward run under."""
    import torch
    import torch.nn.functional as F

    model, batch, generator = model_and_batch(plan, job["seed"])
    with torch.no_grad():
        shape = plan.Logits(model)(*[value[:1] for value in batch]).shape
    labels = torch.randint(
        0, shape[-1], (batch[0].shape[0],) + tuple(shape[1:-1]), generator=generator
    )
    share, replica = batch[0].shape[0] // plan.DATA_PARALLEL, mesh.get_local_rank("dp")
    rows = slice(replica * share, (replica + 1) * share)
    inputs, targets = [value[rows] for value in batch], labels[rows]
    first = [value[: share // plan.NUM_MICROBATCHES] for value in inputs]
    # a file exported before interleaved schedules: build_stage
    one = not hasattr(plan, "build_stages")
    pp_rank, group = mesh.get_local_rank("pp"), mesh.get_group("pp")
    stages = (
        [plan.build_stage(model, first, pp_rank, group)]
        if one
        else plan.build_stages(model, first, pp_rank, group)
    )
    context = contextlib.nullcontext
    if getattr(plan, "TENSOR_PARALLEL", 1) > 1:
        from torch.distributed.tensor.experimental import implicit_replication

        for stage in stages:
            plan.parallelize_stage(stage, mesh["tp"])
        context = implicit_replication

    def loss_fn(out, target):
        if plan.LOSS == "sum":
            return out.sum()
        return F.cross_entropy(out.reshape(-1, out.shape[-1]), target.reshape(-1), reduction="sum")

    return stages, plan.schedule(stages[0] if one else stages, loss_fn), inputs, targets, context


def _count_sends(stages, record) -> list:
    """Hooks that record the stage's sends: its outputs forward (but the last stage's), and backward
    the gradients of the inputs it receives that need one (but the first stage's)."""

    def sent(tensors):
        for value in tensors:
            record.transfers.append(("p2p", ("pp",), float(value.numel() * value.element_size())))

    hooks = []
    for stage in stages:
        if not stage.is_last:
            hooks.append(
                stage.submod.register_forward_hook(
                    lambda module, args, out: sent(
                        [
                            o
                            for o in (out if isinstance(out, tuple) else (out,))
                            if hasattr(o, "numel")
                        ]
                    )
                )
            )
        if not stage.is_first:
            hooks.append(
                stage.submod.register_forward_pre_hook(
                    lambda module, args: sent(
                        [a for a in args if hasattr(a, "requires_grad") and a.requires_grad]
                    )
                )
            )
    return hooks


def _update(stages, tied: list, dp_group, lr: float, record=None) -> None:
    """SGD on the stage's parameters: gradients summed over the replicas (a tensor-parallel shard
    with its peers) and between tied copies (their local blocks if both have one layout, else
    whole), then applied. ``record`` (a counting mode, or None) gets the all-reduces: on ``dp``, and
    on ``tied``."""
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor, distribute_tensor

    params = {name: value for stage in stages for name, value in stage.submod.named_parameters()}

    def all_reduce(tensor, group, axis: str):
        dist.all_reduce(tensor, group=group)
        if record is not None:  # one group of 1 sends nothing: verify.wire_bytes counts (n - 1) / n
            record.transfers.append(
                ("all_reduce", (axis,), float(tensor.numel() * tensor.element_size()))
            )

    with torch.no_grad():
        for value in params.values():
            if value.grad is not None:
                all_reduce(
                    value.grad.to_local() if isinstance(value.grad, DTensor) else value.grad,
                    dp_group,
                    "dp",
                )
        for name, group, same in tied:
            grad = params[name].grad
            # both copies in one layout: their local blocks match
            if same or not isinstance(grad, DTensor):
                all_reduce(grad.to_local() if isinstance(grad, DTensor) else grad, group, "tied")
                continue
            whole = grad.full_tensor()
            all_reduce(whole, group, "tied")
            params[name].grad = distribute_tensor(whole, grad.device_mesh, grad.placements)
        for value in params.values():
            if value.grad is not None:
                value -= lr * value.grad
                value.grad = None


def _tied_groups(plan, stages, dist) -> list:
    """(this rank's name of a tied copy, the group of the ranks holding its copies at this replica,
    whether both copies have one layout)."""
    names = {name for stage in stages for name, _ in stage.submod.named_parameters()}
    held = [[f"m.{n}" for pair in plan.TIED for n in pair if f"m.{n}" in names]]
    every: list = [None] * dist.get_world_size()
    dist.all_gather_object(every, held[0])
    out = []
    # ranks of one stage: (replica, tp peer)
    width = plan.DATA_PARALLEL * getattr(plan, "TENSOR_PARALLEL", 1)
    for owner, alias in plan.TIED:
        for replica in range(width):
            ranks = [
                r
                for r in range(dist.get_world_size())
                if r % width == replica and {f"m.{owner}", f"m.{alias}"} & set(every[r])
            ]
            group = dist.new_group(ranks) if len(ranks) > 1 else None
            mine = [n for n in (f"m.{owner}", f"m.{alias}") if n in names]
            if group is not None and dist.get_rank() in ranks and mine:
                placements = getattr(plan, "PARAM_PLACEMENTS", {})
                out.append((mine[0], group, placements.get(owner) == placements.get(alias)))
    return out
