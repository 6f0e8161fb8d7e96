"""Compile one training step of a plan with XLA on emulated CPU devices and read its collectives.

The parent process never imports JAX: ``compiled_collectives`` runs ``python -m planner.engines.xla JOB OUT``
with ``XLA_FLAGS=--xla_force_host_platform_device_count=N`` in a subprocess. There the IR graph
runs through the JAX interpreter (float32) with a ``with_sharding_constraint`` on every operator
input (the layout the plan's consumer reads: one constraint per edge, as the cost model charges
per edge) and on every output without Partial placements; parameters and data enter with their
first consumer's layout; the step is loss + ``jax.grad`` + an SGD update, jitted with those
shardings. The compiled HLO's all-reduce, all-gather, reduce-scatter, all-to-all and
collective-permute ops are read with their byte sizes and replica groups (list form ``{{0,1},..}``,
iota form ``[G,S]<=[dims]T(perm)`` and mesh form ``mesh['a'=2,'b'=4] {'a'}``), and each group is
mapped to the mesh axes its devices differ in.

The CPU backend has no reduce-scatter: it writes an all-reduce whose results are only sliced down
to the device's block (a fusion fed by the partition id); such an all-reduce is read as the
reduce-scatter it implements. Data tensors are fed once per consumer, each copy in the layout that
consumer reads (an input pipeline delivers what each device needs; the cost model charges nothing
for data). Bytes follow the cost model's convention: n is the full buffer on the axis (all-reduce and
reduce-scatter: the input, all-gather: the output, all-to-all: one rank's buffer);
``planner.engines.verify`` compares the bytes each device sends (see there).
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from planner.errors import PlannerError

KINDS = {"all-reduce": "all_reduce", "all-gather": "all_gather", "reduce-scatter": "reduce_scatter",
         "all-to-all": "all_to_all", "collective-permute": "p2p"}
DTYPE_BYTES = {"f64": 8, "f32": 4, "bf16": 2, "f16": 2, "s64": 8, "s32": 4, "u32": 4, "s8": 1, "u8": 1, "pred": 1,
               "s16": 2, "u16": 2, "u64": 8}
LINE = re.compile(r"=\s*(?P<shape>\(.*?\)|[a-z0-9]+\[[0-9,]*\](?:\{[^}]*\})?)\s+"
                  r"(?P<op>all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)(?:-start)?\(")


class VerifyError(PlannerError):
    """The XLA check could not run (JAX missing, compilation failed)."""


@dataclass(frozen=True, slots=True)
class HloCollective:
    kind: str  # all_reduce | all_gather | reduce_scatter | all_to_all | p2p
    nbytes: float  # n, the cost model's convention
    axes: tuple[str, ...]  # mesh axes the group spans, in mesh order


def shape_bytes(text: str) -> int:
    """Bytes of an HLO shape (a tuple sums its elements)."""
    total = 0
    for dtype, dims in re.findall(r"([a-z]+[0-9]*)\[([0-9,]*)\]", text):
        total += DTYPE_BYTES.get(dtype, 4) * math.prod(int(d) for d in dims.split(",") if d)
    return total


def replica_groups(line: str, num_devices: int) -> list[list[int]]:
    """Device groups of a collective: list form, iota form, or source-target pairs."""
    import numpy as np
    match = re.search(r"replica_groups=\{(\{[0-9,]*\}(?:,\{[0-9,]*\})*)?\}", line)
    if match:
        groups = [[int(x) for x in g.split(",") if x] for g in re.findall(r"\{([0-9,]*)\}", match.group(1) or "")]
        return [g for g in groups if g] or [list(range(num_devices))]
    match = re.search(r"replica_groups=\[([0-9,]+)\]<=\[([0-9,]+)\](?:T\(([0-9,]+)\))?", line)
    if match:
        shape = [int(x) for x in match.group(1).split(",")]
        dims = [int(x) for x in match.group(2).split(",")]
        ids = np.arange(math.prod(dims)).reshape(dims)
        if match.group(3):
            ids = ids.transpose([int(x) for x in match.group(3).split(",")])
        return ids.reshape(shape[0], -1).tolist()
    match = re.search(r"replica_groups=mesh\[([^\]]*)\](?:,\s*device_ids=\(([^)]*\)?)\))?\s*\{([^}]*)\}", line)
    if match:  # mesh form: device ids over named dims (row-major, or as device_ids says); groups vary
        dims = re.findall(r"'?([A-Za-z_][A-Za-z0-9_]*)'?\s*=\s*([0-9]+)", match.group(1))
        names = [n for n, _ in dims]
        chosen = [names.index(n) for n in re.findall(r"'?([A-Za-z_][A-Za-z0-9_]*)'?", match.group(3))]
        sizes = [int(s) for _, s in dims]
        ids = np.arange(math.prod(sizes))
        order = re.fullmatch(r"\[([0-9,]+)\](?:T\(([0-9,]+)\))?", (match.group(2) or "").strip())
        if order:  # iota device order: arange(prod).reshape(dims).transpose(perm)
            ids = ids.reshape([int(x) for x in order.group(1).split(",")])
            if order.group(2):
                ids = ids.transpose([int(x) for x in order.group(2).split(",")])
        elif match.group(2):
            ids = np.array([int(x) for x in re.findall(r"[0-9]+", match.group(2))])
        ids = ids.reshape(sizes)
        rest = [ax for ax in range(len(dims)) if ax not in chosen]
        return ids.transpose(rest + chosen).reshape(-1, math.prod(int(dims[ax][1]) for ax in chosen)).tolist()
    match = re.search(r"source_target_pairs=\{((?:\{[0-9]+,[0-9]+\},?)*)\}", line)
    if match:
        return [[int(a), int(b)] for a, b in re.findall(r"\{([0-9]+),([0-9]+)\}", match.group(1))]
    return [list(range(num_devices))]


def group_axes(groups: list[list[int]], mesh_shape: tuple[int, ...], axis_names: tuple[str, ...]) -> tuple[str, ...]:
    import numpy as np
    varying = set()
    for group in groups:
        coords = np.array([np.unravel_index(d, mesh_shape) for d in group])
        varying |= {ax for ax in range(len(mesh_shape)) if len(set(coords[:, ax])) > 1}
    return tuple(axis_names[ax] for ax in sorted(varying))


INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%(?P<name>[\w.\-]+)\s*=\s*(?P<shape>\([^=]*?\)|\S+)\s+(?P<op>[\w\-]+)\((?P<args>[^)]*)")


def _users(hlo: str) -> tuple[dict[str, list[str]], dict[str, tuple[str, str, list[str]]]]:
    """Users of every instruction, and each instruction's (shape, opcode, operands)."""
    users: dict[str, list[str]] = {}
    defs = {}
    for line in hlo.splitlines():
        match = INSTRUCTION.match(line)
        if not match:
            continue
        operands = re.findall(r"%([\w.\-]+)", match.group("args"))
        defs[match.group("name")] = (match.group("shape"), match.group("op"), operands)
        for operand in operands:
            users.setdefault(operand, []).append(match.group("name"))
    return users, defs


def _elements(shape: str) -> int:
    return sum(math.prod(int(d) for d in dims.split(",") if d) for dims in re.findall(r"\[([0-9,]*)\]", shape))


def _is_scatter(name: str, group: int, users, defs) -> bool:
    """An all-reduce whose every result is only cut down to this device's 1/group block (a slice
    indexed by the partition id): the reduce-scatter the CPU backend writes as all-reduce + slice."""
    shape, _, _ = defs[name]
    results = [u for u in users.get(name, []) if defs[u][1] == "get-tuple-element"] if shape.startswith("(") else [name]
    if not results:
        return False
    for result in results:
        consumers = users.get(result, [])
        if not consumers:
            return False
        for consumer in consumers:
            operands = defs[consumer][2]
            if not any(defs.get(o, ("", "", []))[1] in ("partition-id", "replica-id") for o in operands):
                return False
            if _elements(defs[consumer][0]) * group != _elements(defs[result][0]):
                return False
    return True


def _all_reduce_parts(name: str, group: int, users, defs) -> list[tuple[str, int]]:
    """(kind, bytes) of an all-reduce: XLA combines independent all-reduces into one of a tuple, so
    each element read out (get-tuple-element) counts on its own, as a reduce-scatter when it is only
    cut down to this device's block; elements nobody reads count as all-reduced."""
    shape = defs[name][0]
    if not shape.startswith("("):
        return [("reduce_scatter" if _is_scatter(name, group, users, defs) else "all_reduce", shape_bytes(shape))]
    parts, seen = [], 0
    for element in (u for u in users.get(name, []) if defs[u][1] == "get-tuple-element"):
        nbytes = shape_bytes(defs[element][0])
        parts.append(("reduce_scatter" if _is_scatter(element, group, users, defs) else "all_reduce", nbytes))
        seen += nbytes
    if shape_bytes(shape) > seen:
        parts.append(("all_reduce", shape_bytes(shape) - seen))
    return parts


def parse_collectives(hlo: str, mesh_shape: tuple[int, ...], axis_names: tuple[str, ...]) -> list[HloCollective]:
    """Every collective of a compiled HLO module with its bytes (n) and mesh axes."""
    out = []
    num_devices = math.prod(mesh_shape)
    users, defs = _users(hlo)
    for line in hlo.splitlines():
        match = LINE.search(line)
        if not match or "-done" in line.split("=")[1].split("(")[0]:
            continue
        kind = KINDS[match.group("op")]
        groups = replica_groups(line, num_devices)
        name = INSTRUCTION.match(line).group("name") if INSTRUCTION.match(line) else ""
        if kind == "all_reduce" and name:
            axes = group_axes(groups, mesh_shape, axis_names)
            out.extend(HloCollective(part_kind, float(nbytes), axes)
                       for part_kind, nbytes in _all_reduce_parts(name, len(groups[0]), users, defs))
            continue
        nbytes = shape_bytes(match.group("shape"))
        if kind == "reduce_scatter":
            nbytes *= len(groups[0])
        if kind == "p2p":  # bytes per device: only the pairs that leave a device send anything
            groups = [pair for pair in groups if pair[0] != pair[1]]
            nbytes *= len(groups) / num_devices
            if not groups:
                continue
        out.append(HloCollective(kind, float(nbytes), group_axes(groups, mesh_shape, axis_names)))
    return out


def compiled_collectives(graph, strategies: dict, axis_names: tuple[str, ...], mesh_shape: tuple[int, ...],
                         timeout_s: float = 600.0) -> tuple[list[HloCollective], str]:
    """Compile the plan's training step on emulated CPU devices (subprocess); its collectives and HLO."""
    from planner.ir.graph_json import graph_to_dict
    from planner.outputs import write_json
    with tempfile.TemporaryDirectory() as tmp:
        job, out = Path(tmp) / "job.json", Path(tmp) / "out.json"
        write_json(job, {"graph": graph_to_dict(graph), "axis_names": list(axis_names),
                            "mesh_shape": list(mesh_shape),
                            "strategies": {k: list(v) for k, v in strategies.items()}})
        env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={math.prod(mesh_shape)}",
                   JAX_PLATFORMS="cpu")
        proc = subprocess.run([sys.executable, "-m", "planner.engines.xla", str(job), str(out)], env=env,
                              capture_output=True, text=True, timeout=timeout_s)
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise VerifyError(f"verify: XLA compilation failed ({last})")
        hlo = json.loads(out.read_text())["hlo"]
    return parse_collectives(hlo, mesh_shape, axis_names), hlo


def data_key(op_name: str, slot: int) -> str:
    """The name of one consumer's copy of a data tensor (data are fed once per consumer)."""
    return f"{op_name}#{slot}"


def data_copies(graph, feeds: dict) -> dict:
    """Per data consumer, its copy of the data value (see ``data_key``)."""
    return {data_key(op.name, slot): feeds[o.tensor] for op in graph.operators for slot, o in enumerate(op.inputs)
            if graph.tensor(o.tensor).role == "data"}


def _two_way_constraint():
    """``constrain(x, forward, backward)``: sharding constraints on a value and, separately, on its
    cotangent (None leaves that side free)."""
    from functools import partial

    import jax

    @partial(jax.custom_vjp, nondiff_argnums=(1, 2))
    def constrain(x, forward, backward):
        return x if forward is None else jax.lax.with_sharding_constraint(x, forward)

    def constrain_fwd(x, forward, backward):
        return constrain(x, forward, backward), None

    def constrain_bwd(forward, backward, _, cotangent):
        return (cotangent if backward is None else jax.lax.with_sharding_constraint(cotangent, backward),)
    constrain.defvjp(constrain_fwd, constrain_bwd)
    return constrain


def _edge_hooks(graph, exported, sharding):
    """The interpreter hooks that put the plan's layouts on every edge: ``make_on_input(data)`` (data
    tensors are read from the consumer's own copy) and ``on_output``."""
    import jax
    import jax.numpy as jnp

    from planner.cost.strategy import PARTIAL, forward_layout, gradient_layout, gradient_target

    constrain = _two_way_constraint()
    inputs = {(op, slot): layout for op, slot, layout in exported.inputs}
    outputs = {(op, slot): layout for op, slot, layout in exported.outputs}
    target = lambda layout, ndim: None if PARTIAL in layout else sharding(layout, ndim)
    # Where each tensor's gradient must arrive: its producer's gradient target, or a leaf's layout.
    arrive = dict(exported.leaves)
    for op in graph.operators:
        for slot, operand in enumerate(op.outputs):
            arrive[operand.tensor] = gradient_target(outputs[(op.name, slot)])

    def make_on_input(data: dict):
        def on_input(op, slot, value):
            # The consumer reads its layout. Its gradient leaves in its gradient layout, with the axes
            # where it is Partial reduced right here into the placement the producer wants (all-reduce
            # or reduce-scatter, as the cost model's redistribution does first); the producer's own
            # constraint then gathers what remains.
            layout = inputs[(op.name, slot)]
            if graph.tensor(op.inputs[slot].tensor).role == "data":
                value = data[data_key(op.name, slot)]
            if not jnp.issubdtype(value.dtype, jnp.floating) or graph.tensor(op.inputs[slot].tensor).role == "data":
                return jax.lax.with_sharding_constraint(value, sharding(forward_layout(layout), value.ndim))
            want = arrive[op.inputs[slot].tensor]
            grad = tuple(want[k] if p == PARTIAL else p for k, p in enumerate(gradient_layout(layout)))
            return constrain(value, target(forward_layout(layout), value.ndim), target(grad, value.ndim))
        return on_input

    def on_output(op, slot, value):
        layout = outputs[(op.name, slot)]
        return constrain(value, target(layout, value.ndim), target(gradient_target(layout), value.ndim))
    return make_on_input, on_output


LOSS_WEIGHT = "loss.weight"  # the data key of the verify check's random loss weight


def weighted_loss(graph) -> bool:
    """Whether the XLA check weighs the loss: the gradient of a plain sum (the zoo's ``reduce`` loss)
    is a constant that XLA folds, so the all-gather of that gradient the plan charges (and an engine
    moves for any real loss) would vanish from the compiled step; a random weight in the loss input's
    layout (an elementwise product: no collective) keeps the gradient a tensor to move."""
    return graph.operators[-1].kind == "reduce"


def training_step(graph, exported, mesh, lr: float = 0.01, weighted: bool = False):
    """The jitted SGD step of the graph under the exported shardings: (params, data) -> (loss, params).
    ``weighted``: the loss is the sum of the last operator's input times ``data[LOSS_WEIGHT]``."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec

    from planner.engines.export import spec_of
    from planner.engines.interpret import run_graph
    from planner.cost.strategy import forward_layout

    sharding = lambda layout, ndim: NamedSharding(mesh, PartitionSpec(*spec_of(layout, ndim, exported.axis_names)))
    make_on_input, on_output = _edge_hooks(graph, exported, sharding)
    loss_tensor = graph.operators[-1].outputs[0].tensor
    first_copy = {}
    for op in graph.operators:
        for slot, operand in enumerate(op.inputs):
            if graph.tensor(operand.tensor).role == "data":
                first_copy.setdefault(operand.tensor, data_key(op.name, slot))

    def step(params, data):
        feeds = {**params, **{tensor: data[key] for tensor, key in first_copy.items()}}

        def loss_fn(p):
            on_input = make_on_input(data)
            env = run_graph(graph, {**feeds, **p}, jnp, on_input, on_output)
            if weighted:
                last = graph.operators[-1]
                return jnp.sum(on_input(last, 0, env[last.inputs[0].tensor]) * data[LOSS_WEIGHT])
            return env[loss_tensor].sum()
        loss, grads = jax.value_and_grad(loss_fn)(params)
        return loss, {k: params[k] - lr * grads[k] for k in params}

    leaf = {name: sharding(layout, len(graph.tensor(name).shape)) for name, layout in exported.leaves}
    params = {t.name: leaf[t.name] for t in graph.tensors if t.role == "param"}
    data = {data_key(op_name, slot): sharding(forward_layout(layout), len(graph.tensor(
                graph.operator(op_name).inputs[slot].tensor).shape))
            for op_name, slot, layout in exported.inputs if graph.tensor(graph.operator(op_name).inputs[slot].tensor).role == "data"}
    if weighted:
        last = graph.operators[-1]
        layout = dict(((o, k), lay) for o, k, lay in exported.inputs)[(last.name, 0)]
        data[LOSS_WEIGHT] = sharding(forward_layout(layout), len(graph.tensor(last.inputs[0].tensor).shape))
    return jax.jit(step, in_shardings=(params, data), out_shardings=(NamedSharding(mesh, PartitionSpec()), params))


def plain_step(graph, lr: float = 0.01):
    """The same SGD step on one device, without shardings (the reference of a training run)."""
    import jax
    import jax.numpy as jnp

    from planner.engines.interpret import run_graph
    loss_tensor = graph.operators[-1].outputs[0].tensor

    def step(params, feeds):
        loss, grads = jax.value_and_grad(lambda p: run_graph(graph, {**feeds, **p}, jnp)[loss_tensor].sum())(params)
        return loss, {k: params[k] - lr * grads[k] for k in params}
    return jax.jit(step)


def load_job(job: dict, seed: int = 0):
    """A worker's job (graph, mesh, strategies) on this process's JAX devices: (graph, exported plan,
    JAX mesh, feeds, params, per-consumer data); shared by the XLA check and ``run-jax``."""
    import jax
    import numpy as np
    from jax.sharding import Mesh

    from planner.cluster.mesh import Mesh as PlannerMesh, MeshAxis
    from planner.engines.export import export_plan
    from planner.engines.interpret import random_feeds
    from planner.ir.graph_json import graph_from_dict
    graph = graph_from_dict(job["graph"])
    names, shape = tuple(job["axis_names"]), tuple(job["mesh_shape"])
    strategies = {k: tuple(v) for k, v in job["strategies"].items()}
    exported = export_plan(graph, strategies, PlannerMesh(tuple(MeshAxis(n, s, 1.0, 0.0) for n, s in zip(names, shape))))
    devices = jax.devices()
    if len(devices) < math.prod(shape):
        raise SystemExit(f"{len(devices)} devices, the plan's mesh needs {math.prod(shape)}")
    mesh = Mesh(np.array(devices[: math.prod(shape)]).reshape(shape), names)
    feeds = random_feeds(graph, seed, "float32")
    params = {t.name: feeds[t.name] for t in graph.tensors if t.role == "param"}
    return graph, exported, mesh, feeds, params, data_copies(graph, feeds)


def main(argv: list[str] | None = None) -> int:
    """Worker: ``python -m planner.engines.xla JOB.json OUT.json`` (run by ``compiled_collectives``)."""
    from planner.outputs import write_json
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
