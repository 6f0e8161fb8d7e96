"""planner: exact, profiling-free parallelisation plans for deep-learning training.

The package is layered; each layer imports only the ones above it in this list:

    planner.errors, planner.signals, planner.outputs   base: errors, interrupts, the one file writer
    planner.ir          graphs in einsum form: IR, operator registry, builder, graph JSON
    planner.zoo         built-in models (built with planner.ir)
    planner.cluster     device meshes and machine profiles (datasheet constants)
    planner.cost        settings, strategies and layouts, collectives, redistribution, operator costs,
                        the costed Problem every search works on
    planner.search      CP-SAT program, elimination, decomposition, exact search, baselines, brute force
    planner.plans       Plan: the result of a search, with its cost breakdown
    planner.pipeline    schedules, pipeline searches (exact DP, brute force, CSIMD), 3D plans
    planner.engines     leaves: torch import, JAX/DTensor export, numpy executor, XLA checks, verify
    planner.api         the functions below; planner.cli is the command line on top of it
    planner.show        pictures and tables of a plan (matplotlib, imported only when drawing)
"""

from planner.api import (METHODS, Cluster, compare, evaluate, evaluate_3d, layer_chain, make_cluster, make_problem,
                         plan, plan_pipeline, plan_problem)
from planner.runs import LoadedPlan, export_shardings, load_plan, plan_for_verification, verify_loaded
from planner.cluster.mesh import Mesh, parse_mesh
from planner.cluster.profiles import MachineProfile, get_profile
from planner.cost.settings import TrainingSettings
from planner.errors import GraphError, MeshError, ModelError, PlannerError, ProfileError, SettingsError
from planner.ir.graph import Graph, Operator, Tensor
from planner.ir.graph_json import load_graph, save_graph
from planner.ir.ops import REGISTRY, GraphBuilder
from planner.outputs import write_csv, write_text
from planner.pipeline.schedule import LayerChain
from planner.pipeline.search import METHODS as PIPELINE_METHODS
from planner.plans import Plan
from planner.engines.torch.presets import import_spec as import_torch
from planner.engines.torch.module import module_plan as torch_module_plan
from planner.engines.jax.train import train_3d_on_jax, train_on_jax
from planner.engines.jobs import TrainRun
from planner.engines.torch.train import train_3d_on_torch, train_module_plan, train_on_torch
from planner.search.sapp import sapp_levels
from planner.show.draw import compare_figure, figure_bytes, plan_figure
from planner.zoo import load_model, model_names

__all__ = ["Cluster", "Graph", "GraphBuilder", "GraphError", "LayerChain", "LoadedPlan", "METHODS", "MachineProfile",
           "Mesh", "MeshError", "ModelError", "Operator", "PIPELINE_METHODS", "Plan", "PlannerError", "ProfileError",
           "REGISTRY", "SettingsError", "Tensor", "TrainRun", "TrainingSettings", "compare", "compare_figure",
           "evaluate", "evaluate_3d", "export_shardings", "figure_bytes", "get_profile", "import_torch", "layer_chain", "load_graph",
           "load_model", "load_plan", "make_cluster", "make_problem", "model_names", "parse_mesh", "plan",
           "plan_figure", "plan_for_verification", "plan_pipeline", "plan_problem", "sapp_levels", "save_graph",
           "torch_module_plan", "train_3d_on_jax", "train_3d_on_torch", "train_module_plan", "train_on_jax",
           "train_on_torch", "verify_loaded", "write_csv", "write_text"]
