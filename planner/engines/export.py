"""Export a plan to engines: JAX ``PartitionSpec``s and PyTorch DTensor placements
(docs/engines.md).

A layout (per mesh axis: Shard(tensor dim), Replicate, Partial) becomes
- JAX: one ``PartitionSpec`` entry per tensor dim listing the mesh axes that shard it, in mesh
  order (the first axis holds the major block, as in ``jax.sharding``); Partial has no spec and is
  left unconstrained (the consumer's constraint resolves it);
- PyTorch: one placement per mesh axis: ``Shard(dim)``, ``Replicate()`` or ``Partial()``.
Parameters and data take the layout of their first consumer. Specs are plain tuples and strings
here so that the export needs neither JAX nor PyTorch; ``jax_partition_spec`` and
``torch_placements`` build the library objects.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from planner.ir.graph import Graph
from planner.cluster.mesh import Mesh
from planner.cost.strategy import (
    PARTIAL,
    REPLICATE,
    Layout,
    Strategy,
    forward_layout,
    input_layout,
    operand_layout,
)

Spec = tuple  # per tensor dim: None, an axis name, or a tuple of axis names


def spec_of(layout: Layout, ndim: int, axis_names: tuple[str, ...]) -> Spec | None:
    """PartitionSpec entries of a layout; None when some axis is Partial (no JAX spec exists)."""
    if PARTIAL in layout:
        return None
    entries: list = []
    for dim in range(ndim):
        axes = tuple(axis_names[ax] for ax, p in enumerate(layout) if p == dim)
        entries.append(None if not axes else axes[0] if len(axes) == 1 else axes)
    return tuple(entries)


def placements_of(layout: Layout) -> tuple[str, ...]:
    """DTensor placements, one per mesh axis, as text: 'Shard(i)', 'Replicate()', 'Partial()'."""
    return tuple(
        "Replicate()" if p == REPLICATE else "Partial()" if p == PARTIAL else f"Shard({p})"
        for p in layout
    )


@dataclass(frozen=True, slots=True)
class ExportedPlan:
    """Shardings of one plan: per param/data tensor, per operator input (edge) and output."""

    axis_names: tuple[str, ...]
    mesh_shape: tuple[int, ...]
    leaves: tuple[tuple[str, Layout], ...]  # params and data: the first consumer's forward layout
    inputs: tuple[tuple[str, int, Layout], ...]  # (operator, slot, input layout; GRAD_PARTIAL kept)
    outputs: tuple[tuple[str, int, Layout], ...]  # (operator, slot, layout it writes)

    def leaf_layout(self, tensor: str) -> Layout:
        return dict(self.leaves)[tensor]

    def partition_specs(self, graph: Graph) -> dict[str, Spec]:
        """JAX PartitionSpec entries of every parameter and data tensor."""
        return {
            name: spec_of(layout, len(graph.tensor(name).shape), self.axis_names)
            for name, layout in self.leaves
        }

    def dtensor_placements(self, graph: Graph) -> dict[str, tuple[str, ...]]:
        """DTensor placements of every parameter."""
        return {
            name: placements_of(layout)
            for name, layout in self.leaves
            if graph.tensor(name).role == "param"
        }

    def to_dict(self, graph: Graph) -> dict:
        """A JSON-ready description: mesh, per-parameter specs and placements, per-output specs."""
        specs = self.partition_specs(graph)
        out_specs = {}
        for op_name, slot, layout in self.outputs:
            tensor = graph.operator(op_name).outputs[slot].tensor
            out_specs[tensor] = spec_of(layout, len(graph.tensor(tensor).shape), self.axis_names)
        return {
            "mesh": {"axis_names": list(self.axis_names), "shape": list(self.mesh_shape)},
            "partition_specs": {k: _json_spec(v) for k, v in specs.items()},
            "dtensor_placements": {k: list(v) for k, v in self.dtensor_placements(graph).items()},
            "activation_specs": {k: _json_spec(v) for k, v in out_specs.items()},
        }


def _json_spec(spec: Spec | None):
    return None if spec is None else [list(e) if isinstance(e, tuple) else e for e in spec]


def export_plan(graph: Graph, strategies: Mapping[str, Strategy], mesh: Mesh) -> ExportedPlan:
    """The layouts a plan implies on every leaf, edge and output."""
    leaves: dict[str, Layout] = {}
    inputs, outputs = [], []
    grads = graph.grad_tensors()
    for op in graph.operators:
        strategy = strategies[op.name]
        for slot, operand in enumerate(op.inputs):
            tensor = graph.tensor(operand.tensor)
            layout = input_layout(op, slot, strategy, tensor.name in grads)
            inputs.append((op.name, slot, layout))
            if tensor.role != "activation":
                leaves.setdefault(tensor.name, forward_layout(layout))
        for slot, operand in enumerate(op.outputs):
            outputs.append((op.name, slot, operand_layout(operand, strategy, output=True)))
    return ExportedPlan(
        mesh.names, mesh.shape, tuple(sorted(leaves.items())), tuple(inputs), tuple(outputs)
    )


def jax_partition_spec(spec: Spec):
    """A ``jax.sharding.PartitionSpec`` from spec entries."""
    from jax.sharding import PartitionSpec

    return PartitionSpec(*spec)


def torch_placements(texts: tuple[str, ...]) -> list:
    """DTensor placement objects from their text form."""
    from torch.distributed.tensor import Partial, Replicate, Shard

    out = []
    for text in texts:
        if text.startswith("Shard("):
            out.append(Shard(int(text[6:-1])))
        else:
            out.append(Partial() if text == "Partial()" else Replicate())
    return out


def linear_parallel_plan(graph: Graph, exported: ExportedPlan, tensor_axis: str) -> dict[str, str]:
    """A ``parallelize_module``-style plan for torch Linear layers (weight [out, in]) on one mesh
    axis: 'colwise' when the weight is split on dim 0, 'rowwise' on dim 1, else no entry."""
    axis = exported.axis_names.index(tensor_axis)
    plan = {}
    for name, layout in exported.leaves:
        if (
            name.endswith(".weight")
            and len(graph.tensor(name).shape) == 2
            and layout[axis] in (0, 1)
        ):
            plan[name[: -len(".weight")]] = "colwise" if layout[axis] == 0 else "rowwise"
    return plan


JAX_TEMPLATE = '''"""JAX plan from planner: {title}.

    mesh = jax.make_mesh(MESH_SHAPE, MESH_AXIS_NAMES)
    params = {{k: jax.device_put(v, s) for k, s in shardings(mesh, PARAM_SPECS).items()}}
and inside the jitted step, on the activations,
    jax.lax.with_sharding_constraint(x, NamedSharding(mesh, ACTIVATION_SPECS[name]))
A tensor read in another layout is redistributed by XLA (planner run-jax constrains every edge:
planner run-jax --plan PLAN.json).
"""
from jax.sharding import NamedSharding, PartitionSpec as P

MESH_AXIS_NAMES = {names!r}
MESH_SHAPE = {shape!r}
# parameters and data: the layout of their first reader
PARAM_SPECS = {{{params}
}}
DATA_SPECS = {{{data}
}}
# every operator output the plan does not leave partial (a partial sum has no PartitionSpec)
ACTIVATION_SPECS = {{{activations}
}}


def shardings(mesh, specs):
    """NamedShardings of a spec table on a mesh."""
    return {{name: NamedSharding(mesh, spec) for name, spec in specs.items()}}
'''


def _spec_source(spec: Spec) -> str:
    return "P(" + ", ".join(repr(e) for e in spec) + ")"


def jax_file(graph: Graph, exported: ExportedPlan, title: str) -> str:
    """The plan's PartitionSpecs as a Python file (``planner export --target jax``)."""
    specs = exported.partition_specs(graph)
    rows = {"param": [], "data": []}
    for name, spec in sorted(specs.items()):
        if spec is not None:
            rows["param" if graph.tensor(name).role == "param" else "data"].append(
                f"\n    {name!r}: {_spec_source(spec)},"
            )
    activations = []
    for op_name, slot, layout in exported.outputs:
        tensor = graph.operator(op_name).outputs[slot].tensor
        spec = spec_of(layout, len(graph.tensor(tensor).shape), exported.axis_names)
        if spec is not None:
            activations.append(f"\n    {tensor!r}: {_spec_source(spec)},")
    return JAX_TEMPLATE.format(
        title=title,
        names=exported.axis_names,
        shape=exported.mesh_shape,
        params="".join(rows["param"]),
        data="".join(rows["data"]),
        activations="".join(activations),
    )
