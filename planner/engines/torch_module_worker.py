"""Train an exported PyTorch plan (``planner export --target torch``) on its ``nn.Module``: one rank
under torchrun, or the one-process reference (``reference_losses``).

Both build the module from the plan's ``MODULE`` spec with the same seed, so they start from the same
weights, and draw the same batch (integer inputs below the smallest embedding table, labels below the
number of classes). Each step: the summed loss (``sum`` of the output or its ``cross_entropy``),
backward, plain SGD. A rank applies the file's ``parallelize`` and runs forward and backward under
``implicit_replication`` (tensors the model makes itself are replicated); ``CommDebugMode`` counts
the first step's collectives per mesh axis (``planner.engines.torch_worker.counting_mode``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path


def load_plan_file(path: str):
    """The exported plan file as a Python module."""
    loader = importlib.util.spec_from_file_location("planner_torch_plan", path)
    plan = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(plan)
    return plan


def _model_and_batch(plan, seed: int):
    import torch

    from planner.engines.torch_presets import build_spec
    torch.manual_seed(seed)
    model, inputs, _ = build_spec(plan.MODULE)
    model.eval()  # no dropout: the runs must compute the same function
    if hasattr(model, "set_attn_implementation"):  # DTensor has no sharding rule for CPU flash attention
        model.set_attn_implementation("eager")
    tables = [m.num_embeddings for m in model.modules() if isinstance(m, torch.nn.Embedding)]
    generator = torch.Generator().manual_seed(seed + 1)
    batch = []
    for value in inputs:
        if value.is_floating_point():
            batch.append(torch.randn(value.shape, generator=generator))
        else:
            batch.append(torch.randint(0, min(tables, default=2), value.shape, generator=generator))
    return model, batch, generator


def _loss(plan, output, labels_of, batch: int):
    """The summed loss; labels are drawn for the whole batch (``batch`` samples) and placed."""
    import torch.nn.functional as F
    logits = getattr(output, "logits", output)
    if plan.LOSS == "sum":
        return logits.sum()
    labels = labels_of((batch,) + tuple(logits.shape[1:-1]), logits.shape[-1])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="sum")


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
        with context(), (mode if mode is not None else _null()):
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


def reference_losses(path: str, steps: int, lr: float, seed: int) -> list[float]:
    """The same steps in this process on whole tensors."""
    plan = load_plan_file(path)
    model, batch, generator = _model_and_batch(plan, seed)
    return _run(plan, model, batch, generator, steps, lr, lambda v: v, _null, lambda: None)[0]


def main(argv: list[str] | None = None) -> int:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import distribute_tensor
    from torch.distributed.tensor.experimental import implicit_replication

    from planner.engines.torch_worker import counting_mode
    job_path, out_path = (argv if argv is not None else sys.argv[1:])[:2]
    job = json.loads(Path(job_path).read_text())
    plan = load_plan_file(job["plan"])
    dist.init_process_group("gloo")
    if hasattr(plan, "SPLIT_POINTS"):  # torch.distributed.pipelining stages (export of a 3D plan)
        from planner.engines.pipelining_worker import run_worker
        run_worker(plan, job, out_path)
        dist.barrier()
        dist.destroy_process_group()
        return 0
    mesh = init_device_mesh("cpu", tuple(plan.MESH_SHAPE), mesh_dim_names=tuple(plan.MESH_DIM_NAMES))
    groups = {mesh.get_group(name).group_name: ((name,), dist.get_process_group_ranks(mesh.get_group(name)))
              for name in plan.MESH_DIM_NAMES}
    model, batch, generator = _model_and_batch(plan, job["seed"])
    model = plan.parallelize(model, mesh)
    if getattr(plan, "FULLY_SHARD_MODULES", ()):  # FSDP2 (over tensor parallelism): this rank's batch block
        losses, transfers = _run_fully_sharded(plan, model, mesh, batch, generator, job, groups)
    else:
        losses, transfers = _run(plan, model, batch, generator, job["steps"], job["lr"],
                                 lambda v: distribute_tensor(v, mesh, plan.INPUT_PLACEMENTS), implicit_replication,
                                 lambda: counting_mode(groups))
    if dist.get_rank() == 0:
        from planner.outputs import write_json
        write_json(out_path, {"losses": losses, "transfers": [(k, list(a), n) for k, a, n in transfers],
                              "backend": "gloo"})
    dist.barrier()
    dist.destroy_process_group()
    return 0


def _run_fully_sharded(plan, model, mesh, batch, generator, job, groups):
    """The steps of an FSDP2 plan: the inputs are this rank's batch block (a DTensor on the
    tensor-parallel sub-mesh, if any), the step's loss the sum of the data-parallel ranks' losses."""
    import torch.distributed as dist
    from torch.distributed.tensor import Replicate, distribute_tensor
    from torch.distributed.tensor.experimental import implicit_replication

    from planner.engines.torch_worker import counting_mode
    tp_mesh, dp_group = plan.tensor_parallel_mesh(mesh), plan.fully_sharded_mesh(mesh).get_group()
    tp_dims = [plan.MESH_DIM_NAMES.index(name) for name in tp_mesh.mesh_dim_names] if tp_mesh is not None else []
    # FSDP2's collectives on a flattened mesh count on its axes (verify.wire_bytes splits them)
    groups = {**groups, dp_group.group_name: (tuple(plan.FULLY_SHARD_DIM_NAMES), dist.get_process_group_ranks(dp_group))}
    on_dp = tuple(Replicate() if dim in tp_dims else p for dim, p in enumerate(plan.INPUT_PLACEMENTS))

    def wrap(value):
        block = distribute_tensor(value, mesh, on_dp).to_local()
        if tp_mesh is None:
            return block
        return distribute_tensor(block, tp_mesh, tuple(plan.INPUT_PLACEMENTS[dim] for dim in tp_dims))

    def summed(value):
        value = value.clone()
        dist.all_reduce(value, group=dp_group)
        return value
    context = implicit_replication if tp_mesh is not None else _null
    return _run(plan, model, batch, generator, job["steps"], job["lr"], wrap, context, lambda: counting_mode(groups),
                summed)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from planner.engines.torch_worker import exit_now
    exit_now(main())
