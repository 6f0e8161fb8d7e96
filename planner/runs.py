"""Plans for the engines: a flat plan file resolved against its model (``LoadedPlan``), exported
to JAX shardings and DTensor placements, and verified: the numpy executor, XLA's compiled step
(``planner.engines.jax``) and PyTorch's counted one (``planner.engines.torch``) against the cost
model (``planner.engines.verify``). The engines are composed here, above them, so that the
engine-neutral modules import neither."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from planner.api import make_cluster, make_problem, plan_problem, resolve_model
from planner.cluster.mesh import Mesh, parse_mesh
from planner.cluster.profiles import get_profile
from planner.cost.problem import build_problem
from planner.errors import SettingsError
from planner.ir.graph import Graph
from planner.plan_files import read_plan_file
from planner.plans import strategies_from_mapping
from planner.engines.predicted import VERIFY_SETTINGS
from planner.engines.export import export_plan, linear_parallel_plan
from planner.engines.verify import check_memory
from planner.engines.verify import verify_plan
from planner.engines.jax.xla import compiled_collectives
from planner.engines.torch.train import train_on_torch


@dataclass(frozen=True, slots=True)
class LoadedPlan:
    """A plan file resolved against its model: the graph, the mesh and one strategy per operator."""

    graph: Graph
    mesh: Mesh
    strategies: dict


def load_plan(
    path: Path | str,
    model: str | Graph | None = None,
    batch: int | None = None,
    seq: int | None = None,
) -> LoadedPlan:
    """Read a flat plan JSON (``planner plan --json``); the model comes from its 'source' unless
    given."""
    data = read_plan_file(path)
    if "pipeline" in data:
        raise SettingsError(
            f"--plan: {path} is a 3D plan; export and verify take intra-operator plans (`planner "
            "plan` without --pipeline)"
        )
    source = data.get("source") or {}
    if model is None:
        if "model" not in source:
            raise SettingsError(f"--plan: {path} has no 'source' model; pass --model")
        model, batch, seq = source["model"], batch or source.get("batch"), seq or source.get("seq")
    graph = resolve_model(model, batch, seq)
    mesh = parse_mesh(data["mesh"], get_profile("symbolic"))
    problem = build_problem(graph, mesh, get_profile("symbolic"))
    operators = {o["name"]: o["strategy"] for o in data["operators"]}
    strategies = strategies_from_mapping(problem, operators, where=f"--plan {path}")
    return LoadedPlan(graph, mesh, {t.op.name: s for t, s in zip(problem.ops, strategies)})


def plan_for_verification(
    model: str | Graph,
    mesh: str,
    method: str = "exact",
    *,
    batch: int | None = None,
    seq: int | None = None,
    device: str = "a100-80g",
) -> LoadedPlan:
    """Plan under the settings the XLA check compiles (float32, SGD, no ZeRO, no memory limit)."""
    cluster = make_cluster(mesh, device, float("inf"))
    graph = resolve_model(model, batch, seq)
    problem = make_problem(graph, cluster, VERIFY_SETTINGS)
    result = plan_problem(problem, cluster.memory_limit, method)
    strategies = {a.name: tuple(d for _, d in a.strategy) for a in result.operators}
    return LoadedPlan(graph, cluster.mesh, strategies)


def export_shardings(loaded: LoadedPlan, tensor_axis: str | None = None) -> dict:
    """JAX PartitionSpecs, DTensor placements and a Linear parallelize plan of a loaded plan."""
    exported = export_plan(loaded.graph, loaded.strategies, loaded.mesh)
    data = exported.to_dict(loaded.graph)
    axis = tensor_axis or loaded.mesh.names[-1]
    if axis not in loaded.mesh.names:
        raise SettingsError(
            f"--tensor-axis: {axis!r} is no axis of the plan's mesh {loaded.mesh.spec} (axes: "
            f"{', '.join(loaded.mesh.names)})"
        )
    data["parallelize_plan"] = {
        "mesh_axis": axis,
        "modules": linear_parallel_plan(loaded.graph, exported, axis),
    }
    return data


def verify_loaded(
    loaded: LoadedPlan,
    *,
    run_numpy: bool = True,
    run_xla: bool = True,
    tolerance: float = 0.05,
    devices: int | None = None,
    max_memory: float | None = None,
    run_torch: bool = False,
):
    """Numpy executor and XLA checks of a loaded plan (``planner.engines.verify``). Refuses at once
    (one line with the estimate) when they would need more than ``max_memory`` bytes (default: half
    the free memory)."""
    if devices is not None and devices != loaded.mesh.num_devices:
        raise SettingsError(
            f"--devices: the plan's mesh {loaded.mesh.spec} has {loaded.mesh.num_devices} devices, "
            f"not {devices}"
        )
    check_memory(loaded.graph, loaded.strategies, loaded.mesh, run_numpy, run_xla, max_memory)
    return run_checks(
        loaded.graph,
        loaded.strategies,
        loaded.mesh,
        run_numpy=run_numpy,
        run_xla=run_xla,
        run_torch=run_torch,
        tolerance=tolerance,
    )


def run_checks(
    graph: Graph,
    strategies: dict,
    mesh: Mesh,
    *,
    run_numpy: bool = True,
    run_xla: bool = True,
    run_torch: bool = False,
    tolerance: float = 0.05,
):
    """The checks of ``planner verify`` on a graph and its strategies: the numpy executor, XLA's
    compiled step (``planner.engines.jax``) and one PyTorch step on gloo processes
    (``planner.engines.torch``), each against the cost model (``planner.engines.verify``)."""
    compiled = None
    if run_xla:
        collectives = compiled_collectives(graph, strategies, mesh.names, mesh.shape)[0]
        compiled = [(c.kind, c.axes, c.nbytes) for c in collectives]
    counted = ()
    if run_torch:  # DTensor's collectives counted by CommDebugMode in one training step
        run = train_on_torch(graph, strategies, mesh.names, mesh.shape, steps=1, timeout_s=600.0)
        counted = run.counted_comparison(graph, strategies, mesh)
    return verify_plan(
        graph,
        strategies,
        mesh,
        run_numpy=run_numpy,
        compiled=compiled,
        counted=counted,
        tolerance=tolerance,
    )
