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
    planner.launch      launch configurations: Megatron-LM lines and torchtitan configs written
                        and read back, one registry of engines (``planner.launch.TARGETS``)
    planner.show        pictures and tables of a plan (matplotlib, imported only when drawing)
"""

from dataclasses import fields as _fields

from planner import api as _api
from planner import api3d as _api3d
from planner.api import METHODS, Cluster
from planner.cost.settings import TrainingSettings
from planner.engines.jax import train as _jax_train
from planner.engines.torch import presets as _presets
from planner.engines.torch import train as _torch_train
from planner.errors import PlannerError, SettingsError, naming_parameters
from planner.ir.graph import Graph
from planner.ir.ops import GraphBuilder
from planner.pipeline.plan3d import Plan3D
from planner.plans import Plan
from planner import runs as _runs
from planner.show import draw as _draw
from planner import zoo as _zoo

# Errors raised from these functions name the Python parameter (``mesh: ...``), not the command
# line's flag (``--mesh: ...``); a flag that is a field of the training settings reads
# ``settings.<field>``. The command line calls planner.api directly and keeps its flags.
_ALIASES = {
    **{f.name.replace("_", "-"): f"settings.{f.name}" for f in _fields(TrainingSettings)},
    "bucket-mb": "settings.bucket_bytes",
    "hardware": "hardware_csv",
    "time-limit": "time_limit_s",
}


def _named(func, **aliases: str):
    return naming_parameters(
        func, {**_ALIASES, **{k.replace("_", "-"): v for k, v in aliases.items()}}
    )


plan = _named(_api.plan)
evaluate = _named(_api.evaluate)
compare = _named(_api.compare, method="methods")
make_cluster = _named(_api.make_cluster)
make_problem = _named(_api.make_problem)
plan_problem = _named(_api.plan_problem, memory="memory_limit")
plan_pipeline = _named(_api3d.plan_pipeline, pp="degrees", num_microbatches="counts")
evaluate_3d = _named(_api3d.evaluate_3d)
layer_chain = _named(_api3d.layer_chain, pp="stages")
load_model = _named(_zoo.load_model, model="name")
load_plan = _named(_runs.load_plan, plan="path")
import_torch = _named(_presets.import_spec, module="spec")
train_on_jax = _named(_jax_train.train_on_jax)
train_on_torch = _named(_torch_train.train_on_torch)
plan_figure = _named(_draw.plan_figure)
model_names = _named(_zoo.model_names)

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
