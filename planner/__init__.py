"""planner: exact, profiling-free parallelisation plans for deep-learning training.

The package is layered; each layer imports only the ones above it in this list:

    planner.errors, planner.signals, planner.outputs   base: errors, interrupts, the one file writer
    planner.ir          graphs in einsum form: IR, operator registry, builder, graph JSON
    planner.zoo         built-in models (built with planner.ir)
    planner.cluster     device meshes and machine profiles (datasheet constants)
    planner.cost        settings, strategies and layouts, collectives, redistribution,
                        operator costs, the costed Problem every search works on
    planner.search      CP-SAT program, elimination, decomposition, exact search, baselines,
                        brute force
    planner.plans       Plan: the result of a search, with its cost breakdown
    planner.pipeline    schedules, pipeline searches (exact DP, brute force, CSIMD), 3D plans
    planner.engines     leaves: torch import, JAX/DTensor export, numpy executor, XLA checks, verify
    planner.api         the functions below (planner.api3d: the pipeline ones); planner.cli is the
                        command line on top of them
    planner.show        pictures and tables of a plan (matplotlib, imported only when drawing)
"""

from planner.api import (
    METHODS,
    Cluster,
    compare,
    evaluate,
    make_cluster,
    make_problem,
    plan,
    plan_problem,
)
from planner.api3d import evaluate_3d, layer_chain, plan_pipeline
from planner.cost.settings import TrainingSettings
from planner.engines.jax.train import train_on_jax
from planner.engines.torch.presets import import_spec as import_torch
from planner.engines.torch.train import train_on_torch
from planner.errors import PlannerError, SettingsError
from planner.ir.graph import Graph
from planner.ir.ops import GraphBuilder
from planner.pipeline.plan3d import Plan3D
from planner.plans import Plan
from planner.runs import load_plan
from planner.show.draw import plan_figure
from planner.zoo import load_model, model_names

# The public API: what a script needs to plan, cost, compare, load, draw and train a plan.
# Everything else (verification, export internals, experiment helpers) is imported from its own
# module.
__all__ = [
    "METHODS",
    "Cluster",
    "Graph",
    "GraphBuilder",
    "Plan",
    "Plan3D",
    "PlannerError",
    "SettingsError",
    "TrainingSettings",
    "compare",
    "evaluate",
    "evaluate_3d",
    "import_torch",
    "layer_chain",
    "load_model",
    "load_plan",
    "make_cluster",
    "make_problem",
    "model_names",
    "plan",
    "plan_figure",
    "plan_pipeline",
    "plan_problem",
    "train_on_jax",
    "train_on_torch",
]
