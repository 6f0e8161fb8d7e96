"""A 3D plan on JAX (``planner run-jax`` on a 3D plan): pipeline stages on disjoint sub-meshes of
the devices, each stage's intra-operator plan as sharding constraints on its sub-mesh.

Stage k holds devices [k S, (k+1) S) as a mesh of the plan's stage shape (S devices). Its forward is
one jitted function of (its parameters, its micro-batch data, the tensors it receives) that runs its
operators through the JAX interpreter with the plan's constraint on every edge (as
``planner.engines.jax.xla.training_step``); its backward is the jitted ``jax.vjp`` of that function
(the forward recomputed inside, as activation recomputation would). Tensors that cross to stage k+1
move with ``jax.device_put`` onto its mesh in the producer's layout, cotangents back the same way.
GPipe order: every micro-batch forward, then every backward; gradients summed over micro-batches;
a parameter read on several stages (the tied embedding) keeps a copy on each, and every copy is
updated with the sum of their gradients. The loss of a step is the sum of the micro-batches' losses;
the reference is the whole batch in one step on one device (``plain_step``).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from planner.engines.export import spec_of
from planner.engines.interpret import run_operator
from planner.engines.jax.xla import edge_hooks
from planner.cost.strategy import PARTIAL, REPLICATE
from planner.engines.jax.xla import plain_step
from planner.cluster.mesh import Mesh as PlannerMesh, MeshAxis
from planner.engines.export import export_plan
from planner.engines.interpret import random_feeds
from planner.engines.jobs import stage_plan
from planner.ir.crossing import crossing_tensors
from planner.engines.jobs import micro_batch
from planner.engines.jax.xla import data_copies
from planner.outputs import write_json


def _stage_fn(micro, ops, exported, mesh, crossing_out, last: bool):
    """Stage forward: (params, data copies, received) -> crossing tensors, or the loss on the last
    stage."""
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec

    sharding = lambda layout, ndim: NamedSharding(
        mesh, PartitionSpec(*spec_of(layout, ndim, exported.axis_names))
    )
    make_on_input, on_output = edge_hooks(micro, exported, sharding)
    loss_tensor = micro.operators[-1].outputs[0].tensor

    def forward(params, data, received):
        env = {**params, **received}
        on_input = make_on_input(data)
        for op in ops:
            args = [env.get(o.tensor) for o in op.inputs]
            args = [on_input(op, k, a) for k, a in enumerate(args)]
            for k, (operand, value) in enumerate(zip(op.outputs, run_operator(op, args, jnp))):
                env[operand.tensor] = on_output(op, k, value)
        return env[loss_tensor].sum() if last else {name: env[name] for name in crossing_out}

    return forward


def _placed(value, mesh, layout, exported):
    """``value`` moved onto ``mesh`` in ``layout`` (a Partial axis is moved replicated)."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    plain = tuple(REPLICATE if p == PARTIAL else p for p in layout)
    return jax.device_put(
        value, NamedSharding(mesh, PartitionSpec(*spec_of(plain, value.ndim, exported.axis_names)))
    )


def _stage(micro, stage_of: dict, k: int, p: int, exported, mesh, crossing) -> tuple:
    """Stage ``k``'s jitted forward, its backward (the forward's VJP) and its parameters."""
    import jax

    ops = [op for op in micro.operators if stage_of[op.name] == k]
    forward = _stage_fn(micro, ops, exported, mesh, crossing[k] if k < p - 1 else [], k == p - 1)
    backward = jax.jit(
        lambda params, data, received, cotangent, f=forward: jax.vjp(
            lambda p_, r_: f(p_, data, r_), params, received
        )[1](cotangent)
    )
    mine = sorted(
        {o.tensor for op in ops for o in op.inputs if micro.tensor(o.tensor).role == "param"}
    )
    return jax.jit(forward), backward, mine


def _reference_losses(full, feeds: dict, job: dict) -> list[float]:
    """The same steps on one device (the whole graph, plain SGD)."""
    plain = plain_step(full, job["lr"])
    params = {t.name: feeds[t.name] for t in full.tensors if t.role == "param"}
    reference = []
    for _ in range(job["steps"]):
        loss, params = plain(params, feeds)
        reference.append(float(loss))
    return reference


def run_3d(job: dict) -> dict:
    """Losses of ``job['steps']`` GPipe steps of the 3D plan and of the one-device reference."""
    import jax
    import numpy as np
    from jax.sharding import Mesh

    full, micro, stage_of = stage_plan(job)
    names, shape, p = tuple(job["axis_names"]), tuple(job["mesh_shape"]), int(job["stages"])
    size = math.prod(shape)
    devices = jax.devices()
    if len(devices) < p * size:
        raise SystemExit(f"{len(devices)} devices, the 3D plan needs {p * size}")
    meshes = [
        Mesh(np.array(devices[k * size : (k + 1) * size]).reshape(shape), names) for k in range(p)
    ]
    strategies = {k: tuple(v) for k, v in job["strategies"].items()}
    exported = export_plan(
        micro,
        strategies,
        PlannerMesh(tuple(MeshAxis(n, s, 1.0, 0.0) for n, s in zip(names, shape))),
    )
    feeds = random_feeds(full, job["seed"], "float32")
    crossing = crossing_tensors(micro, stage_of, p)
    stages = [_stage(micro, stage_of, k, p, exported, meshes[k], crossing) for k in range(p)]
    losses = _train(job, micro, feeds, stages, meshes, exported, crossing, p)
    reference = _reference_losses(full, feeds, job)
    return {
        "losses": losses,
        "reference": reference,
        "devices": p * size,
        "platform": devices[0].platform,
    }


def _train(job, micro, feeds, stages, meshes, exported, crossing, p):

    leaf = dict(exported.leaves)
    layouts = {micro.operator(op).outputs[k].tensor: lay for op, k, lay in exported.outputs}
    params = [
        {n: _placed(feeds[n], meshes[k], leaf[n], exported) for n in stages[k][2]} for k in range(p)
    ]
    count = int(job["num_microbatches"])
    losses = []
    for _ in range(job["steps"]):
        kept, total = [], 0.0
        for m in range(count):
            batch = data_copies(micro, micro_batch(micro, feeds, m))
            received, inputs = {}, []
            for k in range(p):
                inputs.append(received)
                out = stages[k][0](params[k], batch, received)
                if k == p - 1:
                    total += float(out)
                else:
                    received = {
                        n: _placed(v, meshes[k + 1], layouts[n], exported) for n, v in out.items()
                    }
            kept.append((batch, inputs))
        grads = [{n: 0.0 for n in stages[k][2]} for k in range(p)]
        for batch, inputs in reversed(kept):
            cotangent = 1.0
            for k in reversed(range(p)):
                g_params, g_received = stages[k][1](params[k], batch, inputs[k], cotangent)
                grads[k] = {n: grads[k][n] + g_params[n] for n in grads[k]}
                if k > 0:
                    cotangent = {
                        n: _placed(v, meshes[k - 1], layouts[n], exported)
                        for n, v in g_received.items()
                    }
        params = _update(params, grads, meshes, leaf, exported, job["lr"])
        losses.append(total)
    return losses


def _update(params, grads, meshes, leaf, exported, lr: float):
    """SGD on every copy, with the sum of the gradients of all copies of a parameter."""
    total = {}
    for k, stage_grads in enumerate(grads):
        for name, g in stage_grads.items():
            moved = _placed(g, meshes[0], leaf[name], exported)
            total[name] = moved if name not in total else total[name] + moved
    return [
        {n: v - lr * _placed(total[n], meshes[k], leaf[n], exported) for n, v in stage.items()}
        for k, stage in enumerate(params)
    ]


def main(argv: list[str] | None = None) -> int:
    """Worker: ``python -m planner.engines.jax.pipeline JOB.json OUT.json`` (run by
    ``train_3d_on_jax``)."""
    job_path, out_path = (argv if argv is not None else sys.argv[1:])[:2]
    write_json(out_path, run_3d(json.loads(Path(job_path).read_text())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
