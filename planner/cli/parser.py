"""The argument parser of every command: options, their types and defaults, and exit codes."""

from __future__ import annotations

import argparse
import logging

from planner import api
from planner.cluster.profiles import DEFAULT_HARDWARE_CSV
from planner.cost.settings import option_default, option_fields, option_name
from planner.front import MAX_POINTS, MAX_TOP_K
from planner.launch import TARGETS
from planner.search.options import flag_fields
from planner.pipeline.search import METHODS as PIPELINE_METHODS
from planner.cli.argtypes import (
    Parser,
    add_logging,
    add_picture,
    byte_size,
    count_or_auto,
    cut_list,
    non_negative,
    number,
    positive_int,
    schedule_name,
    seconds,
    seed,
)
from planner.cli.engine_options import add_export, add_runs, add_show, add_verify

log = logging.getLogger("planner")


# The training settings' defaults, as the options spell them: TrainingSettings is their one source.
SETTINGS_DEFAULTS = {option_name(f): option_default(f) for f in option_fields()}


def _add_common(p: argparse.ArgumentParser, model_required: bool = True) -> None:
    add_logging(p, top=False)
    p.add_argument(
        "--model",
        required=model_required,
        help="zoo name, parametric spec (gpt:layers=4,hidden=512,heads=8) or graph .json",
    )
    p.add_argument("--mesh", help="mesh spec: 8, 2x4, node=8,gpu=8 (default 8)")
    p.add_argument(
        "--device",
        help="machine profile: symbolic, a hardware table row, or a .json file (default a100-80g)",
    )
    p.add_argument(
        "--hardware",
        default=DEFAULT_HARDWARE_CSV,
        help="datasheet table in the format of planner/cluster/data/hardware.csv (default: the "
        "built-in table)",
    )
    p.add_argument("--batch", type=positive_int, help="global batch (zoo default if omitted)")
    p.add_argument("--seq", type=positive_int, help="sequence length (language models)")
    p.add_argument(
        "--memory",
        type=byte_size,
        help="memory limit per device in bytes, or none (default: the device's memory)",
    )
    p.add_argument(
        "--memory-headroom",
        type=byte_size,
        default=0.0,
        metavar="BYTES",
        help="memory kept free per device below the limit, for what the model leaves out (the "
        "caching allocator's cached free blocks, fragmentation): e.g. 8GiB (default 0: the "
        "device's reserve for CUDA context, NCCL buffers and workspaces is already kept)",
    )
    _add_settings(p)
    p.add_argument("--json", help="write the plan as JSON here")
    p.add_argument("--csv", help="write one summary row as CSV here")
    p.add_argument(
        "--no-timings",
        action="store_true",
        help="drop search times from JSON and CSV (byte-identical reruns)",
    )


def _add_settings(p: argparse.ArgumentParser) -> None:
    """The training settings, built from ``TrainingSettings``' fields: each field's flag, help,
    choices and default (the field's metadata) are the one source of the option."""
    # None: the default, or the plan file's own value when one is read back
    for f in option_fields():
        meta, default = f.metadata, option_default(f)
        shown = f"{default:g}" if isinstance(default, float) else default
        help_text = f"{meta['help']} (default {'off' if default is False else shown})"
        if isinstance(f.default, bool):
            p.add_argument(meta["flag"], action="store_const", const=True, help=help_text)
        elif meta["choices"]:
            p.add_argument(meta["flag"], choices=list(meta["choices"]), help=help_text)
        else:
            p.add_argument(meta["flag"], type=non_negative, metavar=meta["metavar"], help=help_text)


def _add_search(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--method",
        default="exact",
        choices=list(api.METHODS),
        help="intra-operator search (default exact; dp = data parallelism, zero = ZeRO-3, "
        "megatron-grid = the best Megatron-LM configuration over the tensor-parallel axis and the "
        "uniform recompute/ZeRO modes that auto leaves open)",
    )
    _add_search_options(p, {"time_limit_s": "; with a pipeline: per stage plan"})
    p.add_argument(
        "--require-optimal",
        action="store_true",
        help="exit 4 when the solver stops at its time limit with a FEASIBLE (not proven optimal) "
        "plan",
    )


# each search option's type on the command line (its default and help: SearchOptions)
_SEARCH_TYPES = {"time_limit_s": seconds, "seed": seed, "jobs": positive_int}


def _add_search_options(p: argparse.ArgumentParser, notes: dict, only=None) -> None:
    """The fields of ``SearchOptions`` as options (``only``: these fields), with their defaults and
    help; ``notes`` adds to a field's help what the command does with it."""
    for f in flag_fields():
        if only is None or f.name in only:
            help_text = f"{f.metadata['help']} (default {f.default:g}{notes.get(f.name, '')})"
            p.add_argument(
                f.metadata["flag"], type=_SEARCH_TYPES[f.name], default=f.default, help=help_text
            )


# evaluate: a fixed 3D configuration
DEGREE_OPTIONS = ("tp", "dp", "pp", "micro_batch", "schedule", "cuts")
PIPELINE_OPTIONS = ("schedule", "pp", "num_microbatches", "pipeline_method", "cuts", "certify")


def _add_engine(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--for",
        dest="engine",
        choices=list(TARGETS),
        help="the whole-cluster search restricted to what this engine runs as the plan costs it "
        "(Megatron-LM's stage plans at every tensor degree of a node; the engine's ZeRO, "
        "recompute and schedule options and its loss kernel; bf16 reduces gradients in fp32, as "
        "both do), so the answer exports with `planner export --target ENGINE`",
    )


def _add_pipeline(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--schedule",
        type=schedule_name,
        help="pipeline schedule: gpipe, 1f1b (default) or interleaved[:v] (v model chunks per "
        "device, default 2)",
    )
    p.add_argument(
        "--pp", type=positive_int, help="pipeline degree (default: search every divisor)"
    )
    p.add_argument(
        "--num-microbatches",
        type=count_or_auto,
        help="micro-batch count, or auto: every divisor of the batch (with a pipeline the "
        "default is auto; a flat plan accumulates gradients over the micro-batches and its "
        "default is 1)",
    )
    p.add_argument(
        "--pipeline-method",
        choices=list(PIPELINE_METHODS),
        help="cut search (default csimd; exact = Alpa's dynamic programme)",
    )
    p.add_argument(
        "--cuts",
        type=cut_list,
        help="fixed stage cuts: first layer of stages 1..p-1, e.g. 8,16,24 (needs --pp)",
    )
    p.add_argument(
        "--certify",
        action="store_true",
        help="search the stated 3D space exhaustively (every pipeline degree, stage mesh, stage "
        "plan family, settings variant and micro-batch count, each count with its own stage "
        "plan, cuts by the exact dynamic programme; only branches a lower bound rules out are "
        "skipped): OPTIMAL over that space when every solve is proven; slower than the default",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="planner", description="Exact, profiling-free parallelisation planner.")
    add_logging(parser, top=True)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    _add_planning(sub)
    _add_evaluate(sub)
    _add_import(sub)
    add_export(
        sub.add_parser(
            "export",
            help="a plan for an engine: shardings as JSON, or a Python file for PyTorch "
            "(parallelize_module + DTensor placements) or JAX",
        )
    )
    add_verify(
        sub.add_parser(
            "verify",
            help="check a plan: numpy executor vs unsharded, XLA collectives vs the cost model",
        )
    )
    add_show(
        sub.add_parser(
            "show", help="draw a plan: schedule (Gantt), memory per stage, sharding map (or --text)"
        )
    )
    add_runs(sub)
    return parser


def _add_planning(sub) -> None:
    """models, plan, compare and pipeline."""
    m = sub.add_parser("models", help="list the model zoo")
    add_logging(m, top=False)
    p = sub.add_parser("plan", help="search a plan (intra-operator, or 3D with --pipeline auto)")
    _add_common(p)
    _add_search(p)
    p.add_argument(
        "--pipeline",
        choices=["none", "auto"],
        default="none",
        help="auto: search pipeline degree, cuts and micro-batches too (3D plan); default none",
    )
    p.add_argument(
        "--top-k",
        type=number(int, lambda v: 1 <= v <= MAX_TOP_K, f"an integer in 1..{MAX_TOP_K}"),
        help="the K best distinct plans in increasing cost (the whole-graph program with a "
        "no-good cut per plan; --time-limit per plan); --json and --csv hold all K",
    )
    _add_engine(p)
    _add_pipeline(p)
    c = sub.add_parser("compare", help="compare search methods on one model and cluster")
    _add_common(c)
    c.add_argument(
        "--methods", default=",".join(api.METHODS), help="comma-separated methods (default: all)"
    )
    _add_search_options(c, {"time_limit_s": "; per method"}, only=("time_limit_s", "seed"))
    add_picture(c, "draw the methods side by side (step time and memory)")
    pp = sub.add_parser(
        "pipeline",
        help="3D plan: pipeline stages with intra-operator plans (= plan --pipeline auto)",
    )
    _add_common(pp)
    _add_search(pp)
    pp.add_argument(
        "--devices", type=positive_int, help="device count (mesh node=N/8,gpu=8 unless --mesh)"
    )
    _add_pipeline(pp)
    f = sub.add_parser(
        "pareto", help="the exact time-memory front: every plan no other beats in both"
    )
    _add_common(f)
    _add_search_options(f, {"time_limit_s": "; per search"}, only=("time_limit_s", "seed"))
    f.add_argument(
        "--max-points",
        type=positive_int,
        default=MAX_POINTS,
        help=f"searches at most (each one front point or fewer; default {MAX_POINTS})",
    )
    add_picture(f, "draw the front (memory per device against step time)")


def _add_launch_sources(e: argparse.ArgumentParser) -> None:
    """evaluate's engine configurations: a Megatron-LM line or a torchtitan config."""
    e.add_argument(
        "--from-megatron",
        metavar="FILE",
        help="a Megatron-LM launch line or argument file (torchrun ... pretrain_gpt.py ARGS; '-' "
        "reads stdin), costed as given: model, degrees, batch and settings from its flags, the "
        "data-parallel degree from torchrun's world size or --dp",
    )
    e.add_argument(
        "--from-torchtitan",
        metavar="FILE|MODULE",
        help="a torchtitan 0.3 config_registry file, or a module name as torchtitan's --module "
        "takes it (llama3), loaded by torchtitan's config manager (needs torchtitan; a file's "
        "Python runs in the planner's process), costed as given; its function is --config's",
    )
    e.add_argument(
        "--config",
        default=None,
        help="--from-torchtitan: the config function to call (default planner_plan)",
    )
    e.add_argument(
        "--compare-best",
        action="store_true",
        help="--from-megatron/--from-torchtitan: also search the best Megatron-LM configuration "
        "on the same GPUs and print the gap, the changes that close it (or make a line fit) and "
        "the best as a launch line (seconds to minutes)",
    )


def _add_evaluate(sub) -> None:
    e = sub.add_parser(
        "evaluate", help="cost a given plan: a plan JSON (flat or 3D) or Megatron degrees"
    )
    _add_common(e, model_required=False)
    e.add_argument("--plan", help="plan JSON written by `planner plan --json` (flat or 3D)")
    _add_launch_sources(e)
    e.add_argument(
        "--tp", type=positive_int, help="tensor-parallel degree (Megatron pattern, innermost)"
    )
    e.add_argument("--dp", type=positive_int, help="data-parallel degree")
    e.add_argument(
        "--pp", type=positive_int, help="pipeline degree (even layer split unless --cuts)"
    )
    e.add_argument(
        "--micro-batch",
        type=positive_int,
        help="samples per micro-batch and replica (default: batch / dp, one micro-batch)",
    )
    e.add_argument(
        "--schedule",
        type=schedule_name,
        help="pipeline schedule: gpipe, 1f1b (default) or interleaved[:v] (v model chunks per "
        "device, default 2)",
    )
    e.add_argument(
        "--cuts",
        type=cut_list,
        help="stage cuts: first layer of stages 1..p-1 (default: even split)",
    )


def _add_import(sub) -> None:
    i = sub.add_parser(
        "import-torch", help="import an nn.Module through torch.export into a graph JSON"
    )
    add_logging(i, top=False)
    i.add_argument(
        "spec",
        help="hf:gpt2[:layers=12,seq=1024,batch=1], hf:resnet50[:batch=8], hf:llama, hf:mixtral, "
        "hf:vit, hf:t5, hf:bert (small defaults; key=value overrides) or file.py:function "
        "(returning (module, example_inputs))",
    )
    i.add_argument(
        "--json", required=True, help="graph JSON to write (then: planner plan --model it)"
    )
    i.add_argument(
        "--allow-unknown",
        action="store_true",
        help="map unsupported ops to replicated opaque operators",
    )
    i.add_argument(
        "--loss",
        choices=["sum", "cross_entropy"],
        default="sum",
        help="training loss added on the first output: its sum (default) or its cross-entropy "
        "against integer labels (language and classification models)",
    )
