"""Compile one training step of a plan with XLA on emulated CPU devices and read its collectives.

The parent process never imports JAX: ``compiled_collectives`` runs ``python -m
planner.engines.jax.xla JOB OUT``
with ``XLA_FLAGS=--xla_force_host_platform_device_count=N`` in a subprocess. There the IR graph
runs through the JAX interpreter (float32) with a ``with_sharding_constraint`` on every operator
input (the layout the plan's consumer reads: one constraint per edge, as the cost model charges
per edge) and on every output without Partial placements; parameters and data enter with their
first consumer's layout; the step is loss + ``jax.grad`` + an SGD update, jitted with those
shardings. The compiled HLO's collectives are read by ``planner.engines.hlo``;
``planner.engines.verify``
compares the bytes each device sends (see there). Data tensors are fed once per consumer, each copy
in the layout that consumer reads (an input pipeline delivers what each device needs; the cost
model charges nothing for data). A plain-sum loss is weighted (``weighted_loss``).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from planner.cost.strategy import PARTIAL, REPLICATE, Layout
from planner.engines.hlo import HloCollective, parse_collectives
from planner.engines.jobs import python_worker, run_job
from planner.ir.graph_json import graph_to_dict
from planner.cost.strategy import gradient_layout
from planner.cost.strategy import gradient_target
from planner.cost.strategy import forward_layout
from planner.engines.export import spec_of
from planner.engines.interpret import run_graph
from planner.cluster.mesh import Mesh as PlannerMesh, MeshAxis
from planner.engines.export import export_plan
from planner.engines.interpret import random_feeds
from planner.ir.graph_json import graph_from_dict
from planner.outputs import write_json


def compiled_collectives(
    graph,
    strategies: dict,
    axis_names: tuple[str, ...],
    mesh_shape: tuple[int, ...],
    timeout_s: float = 600.0,
) -> tuple[list[HloCollective], str]:
    """Compile the plan's training step on emulated CPU devices (subprocess); its collectives and
    HLO."""
    job = {
        "graph": graph_to_dict(graph),
        "axis_names": list(axis_names),
        "mesh_shape": list(mesh_shape),
        "strategies": {k: list(v) for k, v in strategies.items()},
    }
    env = {
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={math.prod(mesh_shape)}",
        "JAX_PLATFORMS": "cpu",
    }
    hlo = run_job(
        job,
        lambda j, o: python_worker(
            "planner.engines.jax.xla", j, o, timeout_s, env, "verify: XLA compilation"
        ),
    )["hlo"]
    return parse_collectives(hlo, mesh_shape, axis_names), hlo


def data_key(op_name: str, slot: int) -> str:
    """The name of one consumer's copy of a data tensor (data are fed once per consumer)."""
    return f"{op_name}#{slot}"


def data_copies(graph, feeds: dict) -> dict:
    """Per data consumer, its copy of the data value (see ``data_key``)."""
    return {
        data_key(op.name, slot): feeds[o.tensor]
        for op in graph.operators
        for slot, o in enumerate(op.inputs)
        if graph.tensor(o.tensor).role == "data"
    }


def _two_way_constraint():
    """``constrain(x, forward, backward)``: sharding constraints on a value and, separately, on its
    cotangent (None leaves that side free; a tuple applies each in turn)."""
    from functools import partial

    import jax

    @partial(jax.custom_vjp, nondiff_argnums=(1, 2))
    def constrain(x, forward, backward):
        return x if forward is None else jax.lax.with_sharding_constraint(x, forward)

    def constrain_fwd(x, forward, backward):
        return constrain(x, forward, backward), None

    def constrain_bwd(forward, backward, _, cotangent):
        for sharding in backward if isinstance(backward, tuple) else (backward,):
            if sharding is not None:
                cotangent = jax.lax.with_sharding_constraint(cotangent, sharding)
        return (cotangent,)

    constrain.defvjp(constrain_fwd, constrain_bwd)
    return constrain


def hierarchical_reduction(
    partial: Layout, final: Layout, shape: tuple[int, ...], mesh_shape: tuple[int, ...]
) -> tuple[Layout, ...]:
    """The intermediate layout of a gradient that is Partial over two or more axes and wanted
    replicated on them: the cost model reduces it hierarchically (``hierarchical_all_reduce``:
    reduce-scatter on the inner axes, all-reduce on the outermost, all-gather back). XLA, left to
    itself, all-reduces the full buffer on every axis. Asking for the buffer split over the inner
    axes first makes it reduce-scatter there and all-reduce the scattered piece on the outermost.
    Empty when nothing is to be reduced over two axes or no free dim divides."""
    axes = [ax for ax, p in enumerate(partial) if p == PARTIAL and final[ax] == REPLICATE]
    if len(axes) < 2:
        return ()
    inner = math.prod(mesh_shape[ax] for ax in axes[1:])
    for dim, size in enumerate(shape):
        if dim not in final and size % inner == 0:
            return (tuple(dim if ax in axes[1:] else p for ax, p in enumerate(final)),)
    return ()


def _one_hot_ids(graph, sharding, op, ids, ids_layout: Layout, table_layout: Layout):
    import jax
    import jax.numpy as jnp

    # The lookup runs as the one-hot contraction the cost model prices; its one-hot operand is
    # pinned with the vocabulary split like the table's. Left free, XLA all-gathers a
    # vocabulary-split table instead of reducing the partial output (measured: +4 MB and an
    # all-to-all on node for the 2-layer GPT on 2x4).
    ids = jax.lax.with_sharding_constraint(ids, sharding(ids_layout, ids.ndim))
    vocab = graph.tensor(op.inputs[1].tensor).shape[0]
    one_hot = (jnp.expand_dims(ids, -1) == jnp.arange(vocab)).astype(jnp.float32)
    layout = tuple(ids.ndim if t == 0 else i for i, t in zip(ids_layout, table_layout))
    return jax.lax.with_sharding_constraint(one_hot, sharding(layout, one_hot.ndim))


def _gradient_steps(layout, want, shape, mesh_shape) -> tuple:
    """The layouts a consumer's gradient passes through on its way back: its Partial axes reduced
    into the placement the producer wants (``want``), hierarchically."""
    grad = tuple(want[k] if p == PARTIAL else p for k, p in enumerate(gradient_layout(layout)))
    return (*hierarchical_reduction(gradient_layout(layout), grad, shape, mesh_shape), grad)


def _gradient_arrivals(graph, exported, outputs: dict) -> dict:
    """Where each tensor's gradient must arrive: its producer's gradient target, or a leaf's
    layout."""
    arrive = dict(exported.leaves)
    for op in graph.operators:
        for slot, operand in enumerate(op.outputs):
            arrive[operand.tensor] = gradient_target(outputs[(op.name, slot)])
    return arrive


def edge_hooks(graph, exported, sharding):
    """The interpreter hooks that put the plan's layouts on every edge: ``make_on_input(data)``
    (data tensors are read from the consumer's own copy) and ``on_output``."""
    import jax
    import jax.numpy as jnp

    constrain = _two_way_constraint()
    inputs = {(op, slot): layout for op, slot, layout in exported.inputs}
    outputs = {(op, slot): layout for op, slot, layout in exported.outputs}
    target = lambda layout, ndim: None if PARTIAL in layout else sharding(layout, ndim)
    arrive = _gradient_arrivals(graph, exported, outputs)

    def make_on_input(data: dict):
        def on_input(op, slot, value):
            # The consumer reads its layout. Its gradient leaves in its gradient layout, with the
            # axes where it is Partial reduced right here into the placement the producer wants
            # (all-reduce or reduce-scatter, as the cost model's redistribution does first); the
            # producer's own constraint then gathers what remains.
            layout = inputs[(op.name, slot)]
            if graph.tensor(op.inputs[slot].tensor).role == "data":
                value = data[data_key(op.name, slot)]
            if op.kind == "embedding" and slot == 0:
                table = forward_layout(inputs[(op.name, 1)])
                return _one_hot_ids(graph, sharding, op, value, forward_layout(layout), table)
            if (
                not jnp.issubdtype(value.dtype, jnp.floating)
                or graph.tensor(op.inputs[slot].tensor).role == "data"
            ):
                return jax.lax.with_sharding_constraint(
                    value, sharding(forward_layout(layout), value.ndim)
                )
            want = arrive[op.inputs[slot].tensor]
            steps = _gradient_steps(layout, want, value.shape, exported.mesh_shape)
            return constrain(
                value,
                target(forward_layout(layout), value.ndim),
                tuple(target(step, value.ndim) for step in steps),
            )

        return on_input

    def on_output(op, slot, value):
        layout = outputs[(op.name, slot)]
        return constrain(
            value, target(layout, value.ndim), target(gradient_target(layout), value.ndim)
        )

    return make_on_input, on_output


LOSS_WEIGHT = "loss.weight"  # the data key of the verify check's random loss weight


def weighted_loss(graph) -> bool:
    """Whether the XLA check weighs the loss input: the gradient of a plain sum (the zoo's
    ``reduce`` loss) is a constant. The cost model prices the loss edge's own gradient as free (a
    broadcast) but moves it further up as a tensor, as any real loss needs; XLA would fold the
    constant all the way (measured: the transformer block on 2x4 skipped a 4 MB all-gather). So the
    loss input is multiplied by a random weight where it is produced, in its producer's layout (an
    elementwise product: no collective), when the loss is its only reader."""
    last = graph.operators[-1]
    readers = [op for op in graph.operators for o in op.inputs if o.tensor == last.inputs[0].tensor]
    return last.kind == "reduce" and len(readers) == 1


def _producer(graph, tensor: str) -> tuple[str, int]:
    return next(
        (op.name, k)
        for op in graph.operators
        for k, o in enumerate(op.outputs)
        if o.tensor == tensor
    )


def _step_shardings(graph, exported, sharding, weighted_at) -> tuple[dict, dict]:
    """The shardings of the step's parameters and data (and of the loss weight, when weighted)."""
    leaf = {
        name: sharding(layout, len(graph.tensor(name).shape)) for name, layout in exported.leaves
    }
    params = {t.name: leaf[t.name] for t in graph.tensors if t.role == "param"}
    data = {
        data_key(op_name, slot): sharding(
            forward_layout(layout),
            len(graph.tensor(graph.operator(op_name).inputs[slot].tensor).shape),
        )
        for op_name, slot, layout in exported.inputs
        if graph.tensor(graph.operator(op_name).inputs[slot].tensor).role == "data"
    }
    # in the producer's layout (a Partial axis replicated: the product stays a partial sum)
    if weighted_at is not None:
        layout = dict(((o, k), lay) for o, k, lay in exported.outputs)[weighted_at]
        data[LOSS_WEIGHT] = sharding(
            gradient_target(layout), len(graph.tensor(graph.operators[-1].inputs[0].tensor).shape)
        )
    return params, data


def training_step(graph, exported, mesh, lr: float = 0.01, weighted: bool = False):
    """The jitted SGD step of the graph under the exported shardings: (params, data) -> (loss,
    params). ``weighted``: the loss operator's input is multiplied by ``data[LOSS_WEIGHT]`` where it
    is made."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec

    sharding = lambda layout, ndim: NamedSharding(
        mesh, PartitionSpec(*spec_of(layout, ndim, exported.axis_names))
    )
    make_on_input, constrained_output = edge_hooks(graph, exported, sharding)
    weighted_at = _producer(graph, graph.operators[-1].inputs[0].tensor) if weighted else None
    weight: list = []

    def on_output(op, slot, value):
        value = constrained_output(op, slot, value)
        return value * weight[0] if (op.name, slot) == weighted_at else value

    loss_tensor = graph.operators[-1].outputs[0].tensor
    first_copy = {}
    for op in graph.operators:
        for slot, operand in enumerate(op.inputs):
            if graph.tensor(operand.tensor).role == "data":
                first_copy.setdefault(operand.tensor, data_key(op.name, slot))

    def step(params, data):
        feeds = {**params, **{tensor: data[key] for tensor, key in first_copy.items()}}

        def loss_fn(p):
            weight[:] = [data.get(LOSS_WEIGHT)]
            return run_graph(graph, {**feeds, **p}, jnp, make_on_input(data), on_output)[
                loss_tensor
            ].sum()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        return loss, {k: params[k] - lr * grads[k] for k in params}

    params, data = _step_shardings(graph, exported, sharding, weighted_at)
    return jax.jit(
        step,
        in_shardings=(params, data),
        out_shardings=(NamedSharding(mesh, PartitionSpec()), params),
    )


def plain_step(graph, lr: float = 0.01):
    """The same SGD step on one device, without shardings (the reference of a training run)."""
    import jax
    import jax.numpy as jnp

    loss_tensor = graph.operators[-1].outputs[0].tensor

    def step(params, feeds):
        loss, grads = jax.value_and_grad(
            lambda p: run_graph(graph, {**feeds, **p}, jnp)[loss_tensor].sum()
        )(params)
        return loss, {k: params[k] - lr * grads[k] for k in params}

    return jax.jit(step)


def load_job(job: dict, seed: int = 0):
    """A worker's job (graph, mesh, strategies) on this process's JAX devices: (graph, exported
    plan, JAX mesh, feeds, params, per-consumer data); shared by the XLA check and ``run-jax``."""
    import jax
    import numpy as np
    from jax.sharding import Mesh

    graph = graph_from_dict(job["graph"])
    names, shape = tuple(job["axis_names"]), tuple(job["mesh_shape"])
    strategies = {k: tuple(v) for k, v in job["strategies"].items()}
    exported = export_plan(
        graph,
        strategies,
        PlannerMesh(tuple(MeshAxis(n, s, 1.0, 0.0) for n, s in zip(names, shape))),
    )
    devices = jax.devices()
    if len(devices) < math.prod(shape):
        raise SystemExit(f"{len(devices)} devices, the plan's mesh needs {math.prod(shape)}")
    mesh = Mesh(np.array(devices[: math.prod(shape)]).reshape(shape), names)
    feeds = random_feeds(graph, seed, "float32")
    params = {t.name: feeds[t.name] for t in graph.tensors if t.role == "param"}
    return graph, exported, mesh, feeds, params, data_copies(graph, feeds)


def main(argv: list[str] | None = None) -> int:
    """Worker: ``python -m planner.engines.jax.xla JOB.json OUT.json`` (run by
    ``compiled_collectives``)."""
    job_path, out_path = (argv if argv is not None else sys.argv[1:])[:2]
    graph, exported, mesh, _, params, data = load_job(json.loads(Path(job_path).read_text()))
    weighted = weighted_loss(graph)
    if weighted:
        import numpy as np

        shape = graph.tensor(graph.operators[-1].inputs[0].tensor).shape
        data[LOSS_WEIGHT] = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    compiled = training_step(graph, exported, mesh, weighted=weighted).lower(params, data).compile()
    write_json(out_path, {"hlo": compiled.as_text()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
