"""One rank of ``planner run-torch`` (started by torchrun; see ``planner.engines.train_torch``)."""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import numpy as np


def exit_now(code: int) -> None:
    """End a torchrun rank once its work is done and its process group destroyed, skipping the
    interpreter's teardown: gloo's C++ state sometimes aborts there ('terminate called without an
    active exception', SIGABRT with no Python frame; seen about once in 40 FSDP2 runs), and torchrun
    would then fail a run whose results are written."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _placements(layout):
    from torch.distributed.tensor import Partial, Replicate, Shard

    from planner.cost.strategy import GRAD_PARTIAL, PARTIAL, REPLICATE
    return tuple(Partial() if p in (PARTIAL, GRAD_PARTIAL) else Replicate() if p == REPLICATE else Shard(p)
                 for p in layout)


def _block(value, layout, mesh_shape, coord):
    from planner.engines.executor import block
    return value[block(tuple(value.shape), layout, mesh_shape, coord)].contiguous()


# c10d ops FSDP2 calls -> (cost-model kind, the argument whose bytes are n: the gathered output of
# an all-gather, the unreduced input of a reduce-scatter, the buffer of an all-reduce)
C10D = {"_allgather_base_": ("all_gather", 0), "_reduce_scatter_base_": ("reduce_scatter", 1),
        "allreduce_": ("all_reduce", 0)}


def _group_name(value) -> str | None:
    """The name of a process group passed to a c10d op (it reaches dispatch as a ScriptObject)."""
    import torch
    if not isinstance(value, torch.ScriptObject) or "ProcessGroup" not in str(value._type()):
        return None
    return torch.distributed.ProcessGroup.unbox(value).group_name


def counting_mode(axis_of_group: dict, track_modules: bool = True):
    """``CommDebugMode`` that also records (kind, mesh axes, n bytes) of every collective it counts.
    ``track_modules=False``: without CommDebugMode's per-module tracker, whose forward hooks fail on
    the modules ``torch.distributed.pipelining`` unflattens (an empty parent list)."""
    import torch
    from torch.distributed.tensor.debug import CommDebugMode

    from planner.engines.train_torch import KINDS

    class Counting(CommDebugMode):
        def __init__(self):
            super().__init__()
            self.transfers = []
            self.fallback = []  # gloo's all-gathers that stand for an all-to-all (torch_edges)
            if not track_modules:
                self.advanced_module_tracker = _GlobalOnly()

        def as_all_to_all(self, count_from: int, nbytes: float) -> None:
            """The collectives recorded since ``count_from`` were DTensor's CPU fallback for one
            all-to-all of a ``nbytes`` local buffer: record the all-to-all, keep them aside."""
            moved, self.transfers[count_from:] = self.transfers[count_from:], []
            self.fallback.extend(moved)
            if moved:
                self.transfers.append(("all_to_all", moved[0][1], nbytes))

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = super().__torch_dispatch__(func, types, args, kwargs)
            name = getattr(getattr(func, "_overloadpacket", None), "__name__", "")
            if name in C10D:  # FSDP2's collectives (process-group objects)
                group = next((_group_name(a) for a in args if _group_name(a)), None)
                if group not in axis_of_group:
                    return out
                axis, _ = axis_of_group[group]
                kind, index = C10D[name]
                tensor = args[index]
                size = tensor.numel() * tensor.element_size()
                self.transfers.append((kind, axis, float(size)))
                return out
            kind = KINDS.get(name.rstrip("_"))
            if kind and out is not NotImplemented and isinstance(args[0], torch.Tensor):
                group = next((a for a in list(args[1:]) + list((kwargs or {}).values()) if isinstance(a, str)
                              and a in axis_of_group), None)
                if group is not None:
                    size = args[0].numel() * args[0].element_size()
                    n = size * len(axis_of_group[group][1]) if kind == "all_gather" else size
                    self.transfers.append((kind, axis_of_group[group][0], float(n)))
            return out
    return Counting()


class _GlobalOnly:
    """CommDebugMode's module tracker reduced to what its dispatch reads: every count is "Global"."""

    name, is_bw, activation_checkpointing = "Global", False, False
    module_parents_dict = {"Global": set()}
    module_helper_dict: dict = {}
    module_parameters_dict: dict = {}
    sharding_dict: dict = {}

    def __enter__(self):
        return self

    def __exit__(self, *args):
        return None


def main(argv: list[str] | None = None) -> int:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from planner.ir.graph_json import graph_from_dict
    job_path, out_path = (argv if argv is not None else sys.argv[1:])[:2]
    job = json.loads(Path(job_path).read_text())
    graph = graph_from_dict(job["graph"])
    names, shape = tuple(job["axis_names"]), tuple(job["mesh_shape"])
    backend = "gloo"  # blocks live on the CPU; GPU runs (nccl, blocks on the device) are not built yet
    dist.init_process_group(backend)
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
    coord = tuple(int(c) for c in np.unravel_index(rank, shape))
    groups = {mesh.get_group(name).group_name: ((name,), dist.get_process_group_ranks(mesh.get_group(name)))
              for name in names}
    strategies = {k: tuple(v) for k, v in job["strategies"].items()}
    losses, transfers = _train(graph, strategies, mesh, shape, coord, job, groups)
    if rank == 0:
        from planner.outputs import write_json
        write_json(out_path, {"losses": losses, "transfers": transfers, "backend": backend})
    dist.barrier()
    dist.destroy_process_group()
    return 0


def _train(graph, strategies, mesh, shape, coord, job, groups):
    import torch

    from planner.engines.export import export_plan
    from planner.engines.train_torch import _feeds
    from planner.cluster.mesh import Mesh, MeshAxis
    exported = export_plan(graph, strategies, Mesh(tuple(MeshAxis(n, s, 1.0, 0.0) for n, s in zip(mesh.mesh_dim_names, shape))))
    feeds = _feeds(graph, job["seed"])
    params = {name: _block(feeds[name], layout, shape, coord).requires_grad_(True)
              for name, layout in exported.leaves if graph.tensor(name).role == "param"}
    leaf = dict(exported.leaves)
    losses, transfers = [], []
    for step in range(job["steps"]):
        mode = counting_mode(groups)
        with mode:
            loss = _forward(graph, strategies, exported, mesh, shape, coord, feeds, params, leaf, mode)
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
    run_ops(graph, graph.operators, strategies, exported, mesh, shape, coord, feeds, produced, counter)
    return replicated_loss(graph, mesh, shape, produced)


def replicated_loss(graph, mesh, shape, produced):
    """The loss (the last operator's output) reduced to every rank of ``mesh``, as a local scalar."""
    from torch.distributed.tensor import DTensor, Replicate
    local, layout = produced[graph.operators[-1].outputs[0].tensor]
    loss = DTensor.from_local(local, mesh, _placements(layout), run_check=False, shape=(), stride=())
    return loss.redistribute(mesh, [Replicate()] * len(shape)).to_local()


def run_ops(graph, ops, strategies, exported, mesh, shape, coord, feeds, produced, counter=None,
            defer: frozenset = frozenset()) -> None:
    """Run ``ops`` on this rank's blocks; ``produced`` maps each tensor to (local block, layout) and
    gains the outputs. Data are read from ``feeds`` (whole tensors) in the layout each consumer reads.
    Every edge moves its tensor by the cost model's steps (``PlannedEdge``); ``counter`` is the
    counting mode, told about DTensor's CPU fallback for all-to-all. The parameters in ``defer`` keep
    their gradients Partial (``torch_edges.reduce_deferred`` reduces them once per step)."""
    from planner.cost.strategy import forward_layout
    from planner.engines import torch_xp
    from planner.engines.torch_edges import PlannedEdge
    from planner.engines.executor import _gathered_dims
    from planner.engines.interpret import run_operator
    inputs = {(op, slot): layout for op, slot, layout in exported.inputs}
    for op in ops:
        args = []
        for slot, operand in enumerate(op.inputs):
            layout = inputs[(op.name, slot)]
            if graph.tensor(operand.tensor).role == "data":
                args.append(_block(feeds[operand.tensor], forward_layout(layout), shape, coord))
                continue
            local, src = produced[operand.tensor]
            edge = PlannedEdge(mesh, tuple(graph.tensor(operand.tensor).shape), shape, src, layout, counter,
                               graph.tensor(operand.tensor).role == "param", operand.tensor in defer)
            args.append(edge.apply(local))
        outs = _run_local(op, strategies[op.name], args, shape, coord, run_operator, torch_xp, _gathered_dims)
        for operand, (local, layout) in zip(op.outputs, outs):
            produced[operand.tensor] = (local, layout)


def _strides(shape) -> tuple[int, ...]:
    return tuple(int(math.prod(shape[k + 1:])) for k in range(len(shape)))


def _run_local(op, strategy, args, shape, coord, run_operator, xp, gathered_dims):
    """The operator on this rank's blocks: local sizes and offsets of its coordinate (as the executor)."""
    from planner.cost.strategy import PARTIAL, operand_layout
    from planner.engines.interpret import BIAS
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
