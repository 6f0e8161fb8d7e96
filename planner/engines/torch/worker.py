"""One rank of ``planner run-torch`` (started by torchrun; see ``planner.engines.torch.train``)."""

from __future__ import annotations

import math
import os

import numpy as np

from planner.engines.torch import reference
from planner.engines.torch.counting import counting_mode
from planner.engines.torch.ranks import axis_groups, exit_now, finish, local_block, read_job, start
from planner.cost.strategy import GRAD_PARTIAL, PARTIAL, REPLICATE
from planner.ir.graph_json import graph_from_dict
from planner.engines.export import export_plan
from planner.cluster.mesh import Mesh, MeshAxis
from planner.cost.strategy import forward_layout, input_layout
from planner.engines.executor import gathered_dims, gathered_strategy
from planner.engines.interpret import run_operator
from planner.cost.strategy import operand_layout
from planner.engines.interpret import BIAS


def _placements(layout):
    from torch.distributed.tensor import Partial, Replicate, Shard

    return tuple(
        Partial() if p in (PARTIAL, GRAD_PARTIAL) else Replicate() if p == REPLICATE else Shard(p)
        for p in layout
    )


def main(argv: list[str] | None = None) -> int:

    job, out_path = read_job(argv)
    graph = graph_from_dict(job["graph"])
    names, shape = tuple(job["axis_names"]), tuple(job["mesh_shape"])
    dist, mesh = start(shape, names)
    rank = dist.get_rank()
    coord = tuple(int(c) for c in np.unravel_index(rank, shape))
    strategies = {k: tuple(v) for k, v in job["strategies"].items()}
    losses, transfers = _train(graph, strategies, mesh, shape, coord, job, axis_groups(mesh, names))
    finish(
        out_path,
        {"losses": losses, "transfers": transfers, "backend": "gloo"} if rank == 0 else None,
    )
    return 0


def _train(graph, strategies, mesh, shape, coord, job, groups):
    import torch

    exported = export_plan(
        graph,
        strategies,
        Mesh(tuple(MeshAxis(n, s, 1.0, 0.0) for n, s in zip(mesh.mesh_dim_names, shape))),
    )
    feeds = reference.feeds(graph, job["seed"])
    params = {
        name: local_block(feeds[name], layout, shape, coord).requires_grad_(True)
        for name, layout in exported.leaves
        if graph.tensor(name).role == "param"
    }
    leaf = dict(exported.leaves)
    losses, transfers = [], []
    for step in range(job["steps"]):
        mode = counting_mode(groups)
        with mode:
            loss = _forward(
                graph, strategies, exported, mesh, shape, coord, feeds, params, leaf, mode
            )
            loss.backward()
        losses.append(float(loss.detach()))
        if step == 0:
            transfers = mode.transfers
        with torch.no_grad():
            for p in params.values():
                p -= job["lr"] * p.grad
                p.grad = None
    return losses, [(k, list(a), n) for k, a, n in transfers]


def _forward(graph, strategies, exported, mesh, shape, coord, feeds, params, leaf, counter=None):
    """The loss of one forward pass, every edge a DTensor redistribution (see train_torch)."""
    produced = {name: (value, leaf[name]) for name, value in params.items()}
    run_ops(
        graph, graph.operators, strategies, exported, mesh, shape, coord, feeds, produced, counter
    )
    return replicated_loss(graph, mesh, shape, produced)


def replicated_loss(graph, mesh, shape, produced):
    """The loss (the last operator's output) reduced to every rank of ``mesh``, as a local
    scalar."""
    from torch.distributed.tensor import DTensor, Replicate

    local, layout = produced[graph.operators[-1].outputs[0].tensor]
    loss = DTensor.from_local(
        local, mesh, _placements(layout), run_check=False, shape=(), stride=()
    )
    return loss.redistribute(mesh, [Replicate()] * len(shape)).to_local()


def run_ops(
    graph,
    ops,
    strategies,
    exported,
    mesh,
    shape,
    coord,
    feeds,
    produced,
    counter=None,
    defer: frozenset = frozenset(),
) -> None:
    """Run ``ops`` on this rank's blocks; ``produced`` maps each tensor to (local block, layout) and
    gains the outputs. Data are read from ``feeds`` (whole tensors) in the layout each consumer
    reads. Every edge moves its tensor by the cost model's steps (``PlannedEdge``); ``counter`` is
    the counting mode, told about DTensor's CPU fallback for all-to-all. The parameters in ``defer``
    keep their gradients Partial (``torch_edges.reduce_deferred`` reduces them once per step)."""
    from planner.engines.torch import xp as torch_xp
    from planner.engines.torch.edges import PlannedEdge

    inputs = {(op, slot): layout for op, slot, layout in exported.inputs}
    grads = graph.grad_tensors()
    for op in ops:
        args, strategy = [], gathered_strategy(op, strategies[op.name])
        for slot, operand in enumerate(op.inputs):
            layout = inputs[(op.name, slot)]
            if strategy != strategies[op.name]:  # the normalised dims gathered, as the executor
                layout = input_layout(op, slot, strategy, operand.tensor in grads)
            if graph.tensor(operand.tensor).role == "data":
                args.append(
                    local_block(feeds[operand.tensor], forward_layout(layout), shape, coord)
                )
                continue
            local, src = produced[operand.tensor]
            tensor = graph.tensor(operand.tensor)
            moves = (src, layout, counter, tensor.role == "param", operand.tensor in defer)
            args.append(PlannedEdge(mesh, tuple(tensor.shape), shape, *moves).apply(local))
        outs = _run_local(op, strategy, args, shape, coord, run_operator, torch_xp, gathered_dims)
        for operand, (local, layout) in zip(op.outputs, outs):
            produced[operand.tensor] = (local, layout)


def _strides(shape) -> tuple[int, ...]:
    return tuple(int(math.prod(shape[k + 1 :])) for k in range(len(shape)))


def _run_local(op, strategy, args, shape, coord, run_operator, xp, gathered_dims):
    """The operator on this rank's blocks: local sizes and offsets of its coordinate (as the
    executor)."""
    if gathered_dims(op, strategy):
        raise NotImplementedError(f"run-torch: operator {op.name} splits a dim it normalises over")
    sizes, offsets = dict(op.sizes), {}
    for ax, dim in enumerate(strategy):
        if dim is not None:
            sizes[dim] //= shape[ax]
    for dim in sizes:
        position = 0
        for ax in (ax for ax, d in enumerate(strategy) if d == dim):
            position = position * shape[ax] + coord[ax]
        offsets[dim] = position * sizes[dim]
    layouts = [operand_layout(o, strategy, output=True) for o in op.outputs]
    offsets[BIAS] = int(all(coord[ax] == 0 for ax, p in enumerate(layouts[0]) if p == PARTIAL))
    return list(zip(run_operator(op, args, xp, sizes, offsets), layouts))


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    exit_now(main())
