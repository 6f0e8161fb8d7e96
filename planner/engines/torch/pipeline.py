"""One rank of a 3D plan under ``planner run-torch`` (started by torchrun): pipeline stages over
point-to-point sends, each stage's intra-operator plan as DTensor placements on its sub-mesh.

Rank r holds stage k = r // S (S devices per stage) at stage-mesh coordinate r % S. A stage runs its
operators (the plan's ``stage`` of each) on the micro-batch graph; the blocks of the tensors that
cross to the next stage are sent to the rank with the same stage-mesh coordinate there (each rank
sends its block, as Megatron-LM's scatter/gather sends 1/t), which reads them in the producer's
layout. GPipe order: every micro-batch forward, then every backward (1F1B runs the same arithmetic
in another order). Gradients add up over the micro-batches; a parameter read on several stages (the
tied embedding) keeps a copy on each, whose gradients are all-reduced between them before the SGD
update. The loss of a step is the sum of the micro-batches' losses (the graph's loss is a sum).
"""

from __future__ import annotations

import numpy as np

from planner.engines.jobs import micro_batch, stage_plan
from planner.engines.torch import reference
from planner.engines.torch.counting import counting_mode
from planner.engines.torch.ranks import axis_groups, exit_now, finish, local_block, read_job, start
from planner.ir.crossing import crossing_tensors, stages_reading
from planner.cluster.mesh import Mesh, MeshAxis
from planner.engines.export import export_plan
from planner.cost.strategy import forward_layout
from planner.engines.executor import block as block_slices
from planner.engines.torch.worker import replicated_loss, run_ops


def _tied_groups(micro, stage_of, p: int, size: int, dist):
    """Per parameter read on several stages: this rank's group with its copies (all ranks create
    all)."""
    stages = stages_reading(micro, stage_of)
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
    job, out_path = read_job(argv)
    full, micro, stage_of = stage_plan(job)
    names, shape, p = tuple(job["axis_names"]), tuple(job["mesh_shape"]), int(job["stages"])
    dist, whole = start((p,) + shape, ("pp",) + names)
    mesh = whole[names]
    size = int(np.prod(shape))
    rank = dist.get_rank()
    coord = tuple(int(c) for c in np.unravel_index(rank % size, shape))
    tied = _tied_groups(micro, stage_of, p, size, dist)
    losses, transfers = _train(
        full, micro, stage_of, job, mesh, shape, coord, rank // size, p, size, tied, dist
    )
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, transfers if rank % size == 0 else [])  # one device of each stage
    result = {"losses": losses, "transfers": [t for part in every for t in part], "backend": "gloo"}
    finish(out_path, result if rank == (p - 1) * size else None)
    return 0


def _train(full, micro, stage_of, job, mesh, shape, coord, stage, p, size, tied, dist):
    """SGD steps of this rank's stage; (per-step losses, the collectives of step 0 on this rank)."""
    strategies = {k: tuple(v) for k, v in job["strategies"].items()}
    exported = export_plan(
        micro,
        strategies,
        Mesh(tuple(MeshAxis(n, s, 1.0, 0.0) for n, s in zip(mesh.mesh_dim_names, shape))),
    )
    feeds = reference.feeds(full, job["seed"])
    ops = [op for op in micro.operators if stage_of[op.name] == stage]
    mine = {o.tensor for op in ops for o in op.inputs if micro.tensor(o.tensor).role == "param"}
    leaf = dict(exported.leaves)
    params = {
        n: local_block(feeds[n], leaf[n], shape, coord).requires_grad_(True) for n in sorted(mine)
    }
    deferred = _deferred(micro, ops, exported, leaf)
    groups = axis_groups(mesh, mesh.mesh_dim_names)
    run = dict(
        micro=micro,
        ops=ops,
        strategies=strategies,
        exported=exported,
        mesh=mesh,
        shape=shape,
        coord=coord,
        stage=stage,
        p=p,
        size=size,
        dist=dist,
        params=params,
        leaf=leaf,
        feeds=feeds,
        defer=frozenset(deferred),
        count=int(job["num_microbatches"]),
        crossing=crossing_tensors(micro, stage_of, p),
    )
    losses, transfers = [], []
    for step in range(job["steps"]):
        total, mode = _step(run, deferred, tied, groups, job["lr"])
        if step == 0:
            transfers = [(k, list(a), n) for k, a, n in mode.transfers]
        losses.append(total)
    return losses, transfers


def _step(run: dict, deferred: dict, tied: dict, groups, lr: float):
    """One SGD step of the stage: its micro-batches, the deferred gradient reductions and the tied
    copies' all-reduce; (the summed loss, the counting mode with its transfers)."""
    import torch

    from planner.engines.torch.edges import PlannedEdge, reduce_deferred

    micro, mesh, params, leaf = run["micro"], run["mesh"], run["params"], run["leaf"]
    mode = counting_mode(groups)
    with mode:
        total = _micro_batches(run, mode)
        for name, layout in sorted(deferred.items()):
            shape = tuple(micro.tensor(name).shape)
            edge = PlannedEdge(mesh, shape, run["shape"], leaf[name], layout, mode, True, True)
            params[name].grad = reduce_deferred(edge, params[name].grad)
    # outside the mode: c10d's own all-reduce, recorded here
    for name, group in sorted(tied.items()):
        run["dist"].all_reduce(params[name].grad, group=group)
        grad = params[name].grad
        mode.transfers.append(("all_reduce", ("tied",), float(grad.numel() * grad.element_size())))
    with torch.no_grad():
        for value in params.values():
            value -= lr * value.grad
            value.grad = None
    return total, mode


def _deferred(micro, ops, exported, leaf) -> dict:
    """Parameters read once on this stage, in the layout they are kept in: their gradients stay
    Partial over the micro-batches and are reduced once per step, as the 3D cost model syncs them
    (its 'grad' phase). A parameter read twice on a stage reduces at every micro-batch instead."""
    inputs = {(op, slot): layout for op, slot, layout in exported.inputs}
    reads: dict[str, list] = {}
    for op in ops:
        for slot, o in enumerate(op.inputs):
            if micro.tensor(o.tensor).role == "param":
                reads.setdefault(o.tensor, []).append(inputs[(op.name, slot)])
    return {
        n: lays[0]
        for n, lays in sorted(reads.items())
        if len(lays) == 1 and tuple(forward_layout(lays[0])) == tuple(leaf[n])
    }


def _micro_batches(run: dict, mode) -> float:
    """Every micro-batch forward, then every backward (GPipe); the sends are recorded as p2p."""
    micro, stage, p, size, dist = run["micro"], run["stage"], run["p"], run["size"], run["dist"]
    layouts = {micro.operator(op).outputs[k].tensor: lay for op, k, lay in run["exported"].outputs}
    rank = dist.get_rank()

    def send(block, to):
        dist.send(block, to)
        mode.transfers.append(("p2p", ("pp",), float(block.numel() * block.element_size())))

    kept, total = [], 0.0
    for m in range(run["count"]):
        batch = micro_batch(micro, run["feeds"], m)
        produced = {n: (v, run["leaf"][n]) for n, v in run["params"].items()}
        inputs = []
        for name in run["crossing"][stage - 1] if stage > 0 else ():
            block = _received(
                micro, name, layouts[name], run["shape"], run["coord"], rank - size, dist
            )
            produced[name] = (block, layouts[name])
            inputs.append(block)
        plan = (run["ops"], run["strategies"], run["exported"], run["mesh"], run["shape"])
        run_ops(micro, *plan, run["coord"], batch, produced, mode, run["defer"])
        if stage < p - 1:
            outs = [produced[name][0] for name in run["crossing"][stage]]
            for block in outs:
                send(block.detach().contiguous(), rank + size)
            kept.append((inputs, outs))
        else:
            loss = replicated_loss(micro, run["mesh"], run["shape"], produced)
            total += float(loss.detach())
            kept.append((inputs, [loss]))
    _backward(kept, stage == p - 1, rank, size, dist, send)
    return total


def _backward(kept: list, last: bool, rank: int, size: int, dist, send) -> None:
    """Every micro-batch's backward, last first: the loss's, or the gradients the next stage sends;
    then the input gradients sent to the stage before."""
    import torch

    for inputs, outs in reversed(kept):
        if last:
            outs[0].backward()
        else:
            grads = [torch.empty_like(block) for block in outs]
            for g in grads:
                dist.recv(g, rank + size)
            torch.autograd.backward(outs, grads)
        for block in inputs:
            send(block.grad if block.grad is not None else torch.zeros_like(block), rank - size)


def _received(micro, name, layout, shape, coord, source, dist):
    """The block of a crossing tensor sent by the previous stage's rank at this coordinate."""
    import torch

    whole = micro.tensor(name).shape
    shape_local = tuple(
        len(range(n)[s]) for n, s in zip(whole, block_slices(whole, layout, shape, coord))
    )
    buffer = torch.empty(shape_local, dtype=torch.float32)
    dist.recv(buffer, source)
    return buffer.requires_grad_(True)


if __name__ == "__main__":
    exit_now(main())
