"""One rank of a 3D plan under ``planner run-torch`` (started by torchrun): pipeline stages over
point-to-point sends, each stage's intra-operator plan as DTensor placements on its sub-mesh.

Rank r holds stage k = r // S (S devices per stage) at stage-mesh coordinate r % S. A stage runs its
operators (the plan's ``stage`` of each) on the micro-batch graph; the blocks of the tensors that
cross to the next stage are sent to the rank with the same stage-mesh coordinate there (each rank
sends its block, as Megatron-LM's scatter/gather sends 1/t), which reads them in the producer's
layout. GPipe order: every micro-batch forward, then every backward (1F1B runs the same arithmetic in
another order). Gradients add up over the micro-batches; a parameter read on several stages (the
tied embedding) keeps a copy on each, whose gradients are all-reduced between them before the SGD
update. The loss of a step is the sum of the micro-batches' losses (the graph's loss is a sum).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np


def stage_plan(job):
    from planner.ir.graph_json import graph_from_dict
    full, micro = graph_from_dict(job["graph"]), graph_from_dict(job["micro_graph"])
    stage_of = {name: int(k) for name, k in job["stage_of"].items()}
    return full, micro, stage_of


def crossing_tensors(micro, stage_of, p: int) -> list[list[str]]:
    """Per boundary k (stage k -> k+1): activations made at or before stage k and read after it."""
    made = {o.tensor: stage_of[op.name] for op in micro.operators for o in op.outputs}
    read_after = [set() for _ in range(p)]
    for op in micro.operators:
        for o in op.inputs:
            if o.tensor in made:
                for k in range(made[o.tensor], stage_of[op.name]):
                    read_after[k].add(o.tensor)
    return [sorted(names) for names in read_after[:-1]]


def _tied_groups(micro, stage_of, p: int, size: int, dist):
    """Per parameter read on several stages: this rank's group with its copies (all ranks create all)."""
    stages: dict[str, set[int]] = {}
    for op in micro.operators:
        for o in op.inputs:
            if micro.tensor(o.tensor).role == "param":
                stages.setdefault(o.tensor, set()).add(stage_of[op.name])
    mine = {}
    rank = dist.get_rank()
    for name in sorted(stages):
        if len(stages[name]) < 2:
            continue
        for i in range(size):
            ranks = sorted(k * size + i for k in stages[name])
            group = dist.new_group(ranks)
            if rank in ranks:
                mine[name] = group
    return mine


def main(argv: list[str] | None = None) -> int:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    job_path, out_path = (argv if argv is not None else sys.argv[1:])[:2]
    job = json.loads(Path(job_path).read_text())
    full, micro, stage_of = stage_plan(job)
    names, shape, p = tuple(job["axis_names"]), tuple(job["mesh_shape"]), int(job["stages"])
    dist.init_process_group("gloo")
    size = int(np.prod(shape))
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (p,) + shape, mesh_dim_names=("pp",) + names)[names]
    coord = tuple(int(c) for c in np.unravel_index(rank % size, shape))
    tied = _tied_groups(micro, stage_of, p, size, dist)
    losses = _train(full, micro, stage_of, job, mesh, shape, coord, rank // size, p, size, tied, dist)
    if rank == (p - 1) * size:
        from planner.outputs import write_json
        write_json(out_path, {"losses": losses, "transfers": [], "backend": "gloo"})
    dist.barrier()
    dist.destroy_process_group()
    return 0


def _train(full, micro, stage_of, job, mesh, shape, coord, stage, p, size, tied, dist):
    import torch

    from planner.cluster.mesh import Mesh, MeshAxis
    from planner.engines.export import export_plan
    from planner.engines.torch_worker import _block, replicated_loss, run_ops
    from planner.engines.train_torch import _feeds
    strategies = {k: tuple(v) for k, v in job["strategies"].items()}
    exported = export_plan(micro, strategies, Mesh(tuple(MeshAxis(n, s, 1.0, 0.0) for n, s in zip(mesh.mesh_dim_names, shape))))
    feeds = _feeds(full, job["seed"])
    ops = [op for op in micro.operators if stage_of[op.name] == stage]
    mine = {o.tensor for op in ops for o in op.inputs if micro.tensor(o.tensor).role == "param"}
    leaf = dict(exported.leaves)
    params = {n: _block(feeds[n], leaf[n], shape, coord).requires_grad_(True) for n in sorted(mine)}
    crossing = crossing_tensors(micro, stage_of, p)
    count, b = int(job["num_microbatches"]), micro.tensors[0].shape[0]
    data = [t.name for t in micro.tensors if t.role == "data"]
    layouts = {micro.operator(op).outputs[k].tensor: lay for op, k, lay in exported.outputs}
    rank = dist.get_rank()
    losses = []
    for _ in range(job["steps"]):
        kept, total = [], 0.0
        for m in range(count):
            batch = {n: feeds[n][m * b:(m + 1) * b] for n in data}
            produced = {n: (v, leaf[n]) for n, v in params.items()}
            inputs = []
            if stage > 0:
                for name in crossing[stage - 1]:
                    block = _received(micro, name, layouts[name], shape, coord, rank - size, dist)
                    produced[name] = (block, layouts[name])
                    inputs.append(block)
            run_ops(micro, ops, strategies, exported, mesh, shape, coord, batch, produced)
            if stage < p - 1:
                outs = [produced[name][0] for name in crossing[stage]]
                for block in outs:
                    dist.send(block.detach().contiguous(), rank + size)
                kept.append((inputs, outs))
            else:
                loss = replicated_loss(micro, mesh, shape, produced)
                total += float(loss.detach())
                kept.append((inputs, [loss]))
        for m in reversed(range(count)):
            inputs, outs = kept[m]
            if stage == p - 1:
                outs[0].backward()
            else:
                grads = [torch.empty_like(block) for block in outs]
                for g in grads:
                    dist.recv(g, rank + size)
                torch.autograd.backward(outs, grads)
            for block in inputs:
                dist.send(block.grad if block.grad is not None else torch.zeros_like(block), rank - size)
        for name, group in sorted(tied.items()):
            dist.all_reduce(params[name].grad, group=group)
        with torch.no_grad():
            for value in params.values():
                value -= job["lr"] * value.grad
                value.grad = None
        losses.append(total)
    return losses


def _received(micro, name, layout, shape, coord, source, dist):
    """The block of a crossing tensor sent by the previous stage's rank at this coordinate."""
    import torch

    from planner.engines.executor import block
    whole = micro.tensor(name).shape
    shape_local = tuple(len(range(n)[s]) for n, s in zip(whole, block(whole, layout, shape, coord)))
    buffer = torch.empty(shape_local, dtype=torch.float32)
    dist.recv(buffer, source)
    return buffer.requires_grad_(True)


if __name__ == "__main__":
    sys.exit(main())
