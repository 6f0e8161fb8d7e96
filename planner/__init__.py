"""planner: exact, profiling-free parallelisation plans for deep-learning training."""

from planner.api import METHODS, Cluster, LoadedPlan, compare, evaluate, evaluate_3d, export_shardings, load_plan, plan_for_verification, verify_loaded, layer_chain, plan_pipeline, make_cluster, make_problem, plan, plan_problem
from planner.cost import TrainingSettings
from planner.errors import GraphError, MeshError, ModelError, PlannerError, ProfileError, SettingsError
from planner.graph import Graph, Operator, Tensor
from planner.mesh import Mesh, MachineProfile, get_profile, parse_mesh
from planner.ops import REGISTRY, GraphBuilder
from planner.plans import Plan
from planner.zoo import load_model, model_names
from planner.chains import random_chain
from planner.io import ResultsTable, write_csv, write_png, write_text
from planner.pipeline import METHODS as PIPELINE_METHODS, LayerChain

__all__ = ["METHODS", "Cluster", "compare", "layer_chain", "plan_pipeline", "LayerChain", "random_chain",
           "PIPELINE_METHODS", "ResultsTable", "write_csv", "write_png", "write_text", "Graph", "GraphBuilder", "GraphError", "MachineProfile", "Mesh", "MeshError", "ModelError",
           "Operator", "Plan", "PlannerError", "ProfileError", "REGISTRY", "SettingsError", "Tensor",
           "TrainingSettings", "evaluate", "evaluate_3d", "LoadedPlan", "export_shardings", "load_plan", "plan_for_verification", "verify_loaded", "get_profile", "load_model", "make_cluster", "make_problem",
           "model_names", "parse_mesh", "plan", "plan_problem"]
