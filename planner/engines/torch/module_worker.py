"""Train an exported PyTorch plan (``planner export --target torch``) on its ``nn.Module``: one rank
under torchrun, or the one-process reference (``module_reference_losses``).

Both build the module from the plan's ``MODULE`` spec with the same seed, so they start from the
same weights, and draw the same batch (integer inputs below the smallest embedding table, labels
below the number of classes). Each step: the summed loss (``sum`` of the output or its
``cross_entropy``), backward, plain SGD. A rank applies the file's ``parallelize`` and runs forward
and backward under ``implicit_replication`` (tensors the model makes itself are replicated);
``CommDebugMode`` counts the first step's collectives per mesh axis
(``planner.engines.torch.counting.counting_mode``).
"""

from __future__ import annotations

import os

from planner.engines.torch.counting import counting_mode
from planner.engines.torch.plan_files import load_plan_file, model_and_batch
from planner.engines.torch.ranks import axis_groups, exit_now, finish, read_job, start
from planner.engines.torch.pipelining_worker import run_worker


def _loss(plan, output, labels_of, batch: int):
    """The summed loss; labels are drawn for the whole batch (``batch`` samples) and placed."""
    import torch.nn.functional as F

    logits = getattr(output, "logits", output)
    if plan.LOSS == "sum":
        return logits.sum()
    labels = labels_of((batch,) + tuple(logits.shape[1:-1]), logits.shape[-1])
    return F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="sum"
    )


def _run(plan, model, batch, generator, steps: int, lr: float, wrap, context, counter, total=None):
    """``steps`` SGD steps; ``wrap`` places a whole input, ``context`` wraps forward and backward,
    ``total`` turns a rank's loss into the step's (FSDP: the sum of the ranks' local losses)."""
    import torch

    labels: list = []

    def labels_of(shape, classes):
        if not labels:
            labels.append(wrap(torch.randint(0, classes, shape, generator=generator)))
        return labels[0]

    inputs = [wrap(value) for value in batch]
    losses, transfers = [], []
    for step in range(steps):
        mode = counter() if step == 0 else None
        # the update is counted too: a replicated parameter's partial gradient is all-reduced there
        with context(), mode if mode is not None else _null():
            loss = _loss(plan, model(*inputs), labels_of, batch[0].shape[0])
            loss.backward()
            with torch.no_grad():
                for param in model.parameters():
                    param -= lr * param.grad
                    param.grad = None
        value = loss.full_tensor() if hasattr(loss, "full_tensor") else loss.detach()
        losses.append(float(total(value) if total is not None else value))
        if mode is not None:
            transfers = mode.transfers
    return losses, transfers


def _null():
    import contextlib

    return contextlib.nullcontext()


def module_reference_losses(path: str, steps: int, lr: float, seed: int) -> list[float]:
    """The plan file's steps in this process on whole tensors."""
    plan = load_plan_file(path)
    model, batch, generator = model_and_batch(plan, seed)
    return _run(plan, model, batch, generator, steps, lr, lambda v: v, _null, lambda: None)[0]


def main(argv: list[str] | None = None) -> int:
    from torch.distributed.tensor import distribute_tensor
    from torch.distributed.tensor.experimental import implicit_replication

    job, out_path = read_job(argv)
    plan = load_plan_file(job["plan"])
    dist, mesh = start(tuple(plan.MESH_SHAPE), tuple(plan.MESH_DIM_NAMES))
    if hasattr(plan, "SPLIT_POINTS"):  # torch.distributed.pipelining stages (export of a 3D plan)
        finish(out_path, run_worker(plan, job, mesh))
        return 0
    groups = axis_groups(mesh, plan.MESH_DIM_NAMES)
    model, batch, generator = model_and_batch(plan, job["seed"])
    model = plan.parallelize(model, mesh)
    # FSDP2 (over tensor parallelism): this rank's batch block
    if getattr(plan, "FULLY_SHARD_MODULES", ()):
        losses, transfers = _run_fully_sharded(plan, model, mesh, batch, generator, job, groups)
    else:
        losses, transfers = _run(
            plan,
            model,
            batch,
            generator,
            job["steps"],
            job["lr"],
            lambda v: distribute_tensor(v, mesh, plan.INPUT_PLACEMENTS),
            implicit_replication,
            lambda: counting_mode(groups),
        )
    result = {
        "losses": losses,
        "transfers": [(k, list(a), n) for k, a, n in transfers],
        "backend": "gloo",
    }
    finish(out_path, result if dist.get_rank() == 0 else None)
    return 0


def _run_fully_sharded(plan, model, mesh, batch, generator, job, groups):
    """The steps of an FSDP2 plan: the inputs are this rank's batch block (a DTensor on the
    tensor-parallel sub-mesh, if any), the step's loss the sum of the data-parallel ranks'
    losses."""
    import torch.distributed as dist
    from torch.distributed.tensor import Replicate, distribute_tensor
    from torch.distributed.tensor.experimental import implicit_replication

    tp_mesh, dp_group = plan.tensor_parallel_mesh(mesh), plan.fully_sharded_mesh(mesh).get_group()
    tp_dims = (
        [plan.MESH_DIM_NAMES.index(name) for name in tp_mesh.mesh_dim_names]
        if tp_mesh is not None
        else []
    )
    # FSDP2's collectives on a flattened mesh count on its axes (verify.wire_bytes splits them)
    groups = {
        **groups,
        dp_group.group_name: (
            tuple(plan.FULLY_SHARD_DIM_NAMES),
            dist.get_process_group_ranks(dp_group),
        ),
    }
    on_dp = tuple(
        Replicate() if dim in tp_dims else p for dim, p in enumerate(plan.INPUT_PLACEMENTS)
    )

    def wrap(value):
        block = distribute_tensor(value, mesh, on_dp).to_local()
        if tp_mesh is None:
            return block
        return distribute_tensor(
            block, tp_mesh, tuple(plan.INPUT_PLACEMENTS[dim] for dim in tp_dims)
        )

    def summed(value):
        value = value.clone()
        dist.all_reduce(value, group=dp_group)
        return value

    context = implicit_replication if tp_mesh is not None else _null
    steps = (job["steps"], job["lr"])
    return _run(
        plan, model, batch, generator, *steps, wrap, context, lambda: counting_mode(groups), summed
    )


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    exit_now(main())
