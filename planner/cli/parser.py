"""The argument parser of every command: options, their types and defaults, and exit codes."""

from __future__ import annotations

import argparse
import math
import logging
import re
import sys

from planner import api
from planner.cluster.profiles import DEFAULT_HARDWARE_CSV
from planner.errors import SettingsError
from planner.pipeline.schedule import parse_schedule
from planner.pipeline.search import METHODS as PIPELINE_METHODS

EXIT_OK, EXIT_BAD_INPUT, EXIT_INFEASIBLE, EXIT_NOT_OPTIMAL, EXIT_MISMATCH = 0, 2, 3, 4, 5
log = logging.getLogger("planner")




def _bytes(text: str) -> float:
    if text.strip().lower() in ("none", "inf", "unlimited"):
        return float("inf")
    match = re.fullmatch(r"\s*([0-9.eE+-]+)\s*([KMGT]i?B?|B)?\s*", text)
    if not match:
        raise argparse.ArgumentTypeError(f"cannot parse byte size {text!r} (e.g. 80e9, 40GiB, 16GB)")
    value = float(match.group(1))
    unit = (match.group(2) or "B").rstrip("B") or ""
    scale = {"": 1, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}[unit]
    return value * scale


def _add_logging(p: argparse.ArgumentParser, top: bool) -> None:
    # Accepted before or after the command; the command's copy only overrides when given.
    default = (lambda value: value) if top else (lambda value: argparse.SUPPRESS)
    p.add_argument("-v", "--verbose", action="count", default=default(0), help="more log lines (-vv: debug)")
    p.add_argument("-q", "--quiet", action="store_true", default=default(False), help="errors only; no plan text")
    p.add_argument("--debug", action="store_true", default=default(False), help="show tracebacks")


SETTINGS_DEFAULTS = {"dtype": "bf16", "optimizer": "adam", "zero": 0, "recompute": "none", "overlap": "full",
                     "bucket_mb": 25.0, "fp32_grads": False, "sequence_parallel": False}


def _add_common(p: argparse.ArgumentParser, model_required: bool = True) -> None:
    _add_logging(p, top=False)
    p.add_argument("--model", required=model_required,
                   help="zoo name, parametric spec (gpt:layers=4,hidden=512,heads=8) or graph .json")
    p.add_argument("--mesh", help="mesh spec: 8, 2x4, node=8,gpu=8 (default 8)")
    p.add_argument("--device", help="machine profile: symbolic, a hardware table row, or a .json file (default a100-80g)")
    p.add_argument("--hardware", default=DEFAULT_HARDWARE_CSV,
                   help="datasheet table in the format of planner/cluster/data/hardware.csv (default: the built-in table)")
    p.add_argument("--batch", type=_positive_int, help="global batch (zoo default if omitted)")
    p.add_argument("--seq", type=_positive_int, help="sequence length (language models)")
    p.add_argument("--memory", type=_bytes, help="memory limit per device in bytes, or none (default: the device's memory)")
    # None: the default below, or the plan file's own value when one is read back
    p.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], help="default bf16")
    p.add_argument("--optimizer", choices=["adam", "sgd"], help="default adam")
    p.add_argument("--zero", choices=["0", "1", "2", "3", "auto"],
                   help="ZeRO stage on data-parallel axes; auto = the exact method chooses a stage per layer "
                        "(default 0)")
    p.add_argument("--recompute", choices=["none", "selective", "full", "auto"],
                   help="activation recompute: selective = the attention core (scores, softmax, its dropout) is "
                        "re-run instead of kept; full = only layer inputs are kept; auto = the exact method "
                        "chooses one of these per layer when memory binds (default none)")
    p.add_argument("--sequence-parallel", action="store_const", const=True,
                   help="keep activations that tensor-parallel operators read replicated 1/t-sharded and "
                        "re-gather them in the backward pass (Megatron-LM's sequence parallelism)")
    p.add_argument("--overlap", choices=["none", "grad", "full"],
                   help="communication behind compute: grad = gradient reduction behind the backward pass (DDP, "
                        "Megatron), full = also ZeRO-3 gathers prefetched (FSDP); default full")
    p.add_argument("--bucket-mb", type=_non_negative, metavar="MB",
                   help="gradient bucket size in MiB: smaller tensors share a bucket's collective, a larger "
                        "tensor is one collective of its own, latency paid once per collective (default 25, as "
                        "DDP; 0: one collective per parameter tensor)")
    p.add_argument("--fp32-grads", action="store_const", const=True,
                   help="keep gradients in fp32 (Megatron's main gradients: 18 bytes per parameter with Adam)")
    p.add_argument("--json", help="write the plan as JSON here")
    p.add_argument("--csv", help="write one summary row as CSV here")
    p.add_argument("--no-timings", action="store_true", help="drop search times from JSON and CSV (byte-identical reruns)")


def _add_search(p: argparse.ArgumentParser) -> None:
    p.add_argument("--method", default="exact", choices=list(api.METHODS),
                   help="intra-operator search (default exact; dp = data parallelism, zero = ZeRO-3)")
    p.add_argument("--time-limit", type=_seconds, default=60.0,
                   help="solver time limit in seconds (default 60; with a pipeline: per stage plan)")
    p.add_argument("--require-optimal", action="store_true",
                   help="exit 4 when the solver stops at its time limit with a FEASIBLE (not proven optimal) plan")
    p.add_argument("--seed", type=_seed, default=0, help="solver seed, 0..2^31-1 (default 0)")
    p.add_argument("--jobs", type=_positive_int, default=1,
                   help="worker processes for distinct segments (default 1; at most the CPU count)")


DEGREE_OPTIONS = ("tp", "dp", "pp", "micro_batch", "schedule", "cuts")  # evaluate: a fixed 3D configuration
PIPELINE_OPTIONS = ("schedule", "pp", "num_microbatches", "pipeline_method", "cuts")


def _add_pipeline(p: argparse.ArgumentParser) -> None:
    p.add_argument("--schedule", type=_schedule, help="pipeline schedule: gpipe, 1f1b (default) or interleaved[:v] "
                   "(v model chunks per device, default 2)")
    p.add_argument("--pp", type=_positive_int, help="pipeline degree (default: search every divisor)")
    p.add_argument("--num-microbatches", type=_positive_int, help="micro-batch count (default: search every divisor)")
    p.add_argument("--pipeline-method", choices=list(PIPELINE_METHODS),
                   help="cut search (default csimd; exact = Alpa's dynamic programme)")
    p.add_argument("--cuts", type=_cuts, help="fixed stage cuts: first layer of stages 1..p-1, e.g. 8,16,24 (needs --pp)")


def _cuts(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(c) for c in text.split(",") if c.strip()) if text.strip() else ()
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be comma-separated layer indices, got {text!r}") from None


class _Parser(argparse.ArgumentParser):
    """Argument errors as one line naming the option, exit code 2 (no usage dump)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_BAD_INPUT)


def _schedule(text: str) -> str:
    try:
        parse_schedule(text)
    except SettingsError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--schedule: ")) from None
    return text


def _number(convert, valid, what: str):
    """An argparse type: ``convert`` the text, then check ``valid``; one message names what is wanted."""
    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            value = None
        if value is None or not valid(value):
            shown = text if len(text) <= 40 else f"{text[:20]}...({len(text)} characters)"
            raise argparse.ArgumentTypeError(f"must be {what}, got {shown!r}")
        return value
    return parse


_seed = _number(int, lambda v: 0 <= v < 2**31, "an integer in 0..2^31-1")
_positive_int = _number(int, lambda v: 1 <= v < 2**40, "a positive integer below 2^40")
_seconds = _number(float, lambda v: 0 < v < float("inf"), "a positive finite number of seconds")
# finite: NaN compares below every difference and would pass any run; a negative one would fail
# every run whatever it measured
_tolerance = _number(float, lambda v: 0 <= v < math.inf, "a finite non-negative relative tolerance")
_non_negative = _number(float, lambda v: 0 <= v < 2**30, "a non-negative number of MiB")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="planner", description="Exact, profiling-free parallelisation planner.")
    _add_logging(parser, top=True)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    m = sub.add_parser("models", help="list the model zoo")
    _add_logging(m, top=False)
    p = sub.add_parser("plan", help="search a plan (intra-operator, or 3D with --pipeline auto)")
    _add_common(p)
    _add_search(p)
    p.add_argument("--pipeline", choices=["none", "auto"], default="none",
                   help="auto: search pipeline degree, cuts and micro-batches too (3D plan); default none")
    _add_pipeline(p)
    c = sub.add_parser("compare", help="compare search methods on one model and cluster")
    _add_common(c)
    c.add_argument("--methods", default=",".join(api.METHODS), help="comma-separated methods (default: all)")
    c.add_argument("--time-limit", type=_seconds, default=60.0, help="solver time limit per method (default 60)")
    c.add_argument("--seed", type=_seed, default=0)
    _add_picture(c, "draw the methods side by side (step time and memory)")
    pp = sub.add_parser("pipeline", help="3D plan: pipeline stages with intra-operator plans (= plan --pipeline auto)")
    _add_common(pp)
    _add_search(pp)
    pp.add_argument("--devices", type=_positive_int, help="device count (mesh node=N/8,gpu=8 unless --mesh)")
    _add_pipeline(pp)
    e = sub.add_parser("evaluate", help="cost a given plan: a plan JSON (flat or 3D) or Megatron degrees")
    _add_common(e, model_required=False)
    e.add_argument("--plan", help="plan JSON written by `planner plan --json` (flat or 3D)")
    e.add_argument("--tp", type=_positive_int, help="tensor-parallel degree (Megatron pattern, innermost)")
    e.add_argument("--dp", type=_positive_int, help="data-parallel degree")
    e.add_argument("--pp", type=_positive_int, help="pipeline degree (even layer split unless --cuts)")
    e.add_argument("--micro-batch", type=_positive_int,
                   help="samples per micro-batch and replica (default: batch / dp, one micro-batch)")
    e.add_argument("--schedule", type=_schedule, help="pipeline schedule: gpipe, 1f1b (default) or interleaved[:v] "
                   "(v model chunks per device, default 2)")
    e.add_argument("--cuts", type=_cuts, help="stage cuts: first layer of stages 1..p-1 (default: even split)")
    i = sub.add_parser("import-torch", help="import an nn.Module through torch.export into a graph JSON")
    _add_logging(i, top=False)
    i.add_argument("spec", help="hf:gpt2[:layers=12,seq=1024,batch=1], hf:resnet50[:batch=8], hf:llama, hf:mixtral, "
                                "hf:vit, hf:t5, hf:bert (small defaults; key=value overrides) or file.py:function "
                                "(returning (module, example_inputs))")
    i.add_argument("--json", required=True, help="graph JSON to write (then: planner plan --model it)")
    i.add_argument("--allow-unknown", action="store_true", help="map unsupported ops to replicated opaque operators")
    i.add_argument("--loss", choices=["sum", "cross_entropy"], default="sum",
                   help="training loss added on the first output: its sum (default) or its cross-entropy against "
                        "integer labels (language and classification models)")
    _add_export(sub.add_parser("export", help="a plan for an engine: shardings as JSON, or a Python file for "
                                              "PyTorch (parallelize_module + DTensor placements) or JAX"))
    _add_verify(sub.add_parser("verify", help="check a plan: numpy executor vs unsharded, XLA collectives vs the cost model"))
    _add_show(sub.add_parser("show", help="draw a plan: schedule (Gantt), memory per stage, sharding map (or --text)"))
    _add_runs(sub)
    return parser


def _add_export(x: argparse.ArgumentParser) -> None:
    _add_plan_source(x)
    x.add_argument("--target", choices=["json", "torch", "jax"], default="json",
                   help="json (default): PartitionSpecs, placements and a Linear plan; torch: a Python file with a "
                        "parallelize_module plan and DTensor placements for the nn.Module (then planner run-torch "
                        "--plan FILE); jax: a Python file with the PartitionSpecs and a shardings(mesh) function")
    x.add_argument("--out", help="the Python file to write (--target torch or jax)")
    x.add_argument("--module", help="--target torch: the nn.Module's import-torch spec (default: the one "
                                    "`planner import-torch` recorded in the plan's graph JSON)")
    x.add_argument("--tensor-axis", help="--target json: mesh axis of the Linear parallelize plan (default: the innermost)")
    x.add_argument("--json", help="--target json: write the shardings here (default: print)")


def _add_verify(v: argparse.ArgumentParser) -> None:
    _add_plan_source(v)
    v.add_argument("--devices", type=_positive_int, help="emulated devices (must equal the plan's mesh size)")
    v.add_argument("--tolerance", type=_tolerance, default=0.05, help="relative tolerance on bytes (default 0.05)")
    v.add_argument("--no-xla", action="store_true", help="skip the XLA compilation (no JAX needed)")
    v.add_argument("--no-numpy", action="store_true", help="skip the numpy executor")
    v.add_argument("--torch", action="store_true", help="also train one step on gloo processes (planner run-torch) and "
                   "compare the collectives CommDebugMode counts with the cost model")
    v.add_argument("--max-memory", type=_bytes,
                   help="refuse when the estimated memory of the checks exceeds this (default: half the free memory)")


def _add_runs(sub) -> None:
    _add_run(sub.add_parser("run-jax", help="train a plan K steps on a JAX device mesh (emulated CPU devices) "
                                            "against one device"), "--devices", "devices")
    _add_run(sub.add_parser("run-torch", help="train a plan (flat or 3D) K steps on torchrun processes (gloo on CPU), "
                                              "every layout a DTensor placement, against one process"),
             "--nproc", "processes")


def _add_run(r: argparse.ArgumentParser, count: str, what: str) -> None:
    _add_plan_source(r)
    r.add_argument("--steps", type=_positive_int, default=5, help="SGD steps (default 5)")
    r.add_argument("--lr", type=_number(float, lambda v: 0 < v < 1, "a learning rate in (0, 1)"), default=1e-4,
                   help="SGD learning rate on the summed loss (default 1e-4)")
    r.add_argument("--seed", type=_seed, default=0, help="seed of the initial weights and the batch (default 0)")
    r.add_argument("--tolerance", type=_tolerance, default=1e-4,
                   help="largest relative loss difference to the one-device run (default 1e-4; exit 5 beyond)")
    r.add_argument(count, type=_positive_int, help=f"{what} (must equal the plan's mesh size)")
    r.add_argument("--max-memory", type=_bytes,
                   help="refuse when the estimated memory of the run exceeds this (default: half the free memory)")


def _add_show(w: argparse.ArgumentParser) -> None:
    _add_logging(w, top=False)
    w.add_argument("--plan", required=True, help="plan JSON written by `planner plan --json` (flat or 3D)")
    w.add_argument("--what", choices=["schedule", "memory", "sharding", "all"], default="all",
                   help="which picture (default all, one panel each)")
    _add_picture(w, "draw the plan")
    w.add_argument("--text", action="store_true", help="print the same content as tables (the default without "
                   "--png/--svg)")


def _add_picture(p: argparse.ArgumentParser, what: str) -> None:
    group = p.add_mutually_exclusive_group()
    group.add_argument("--png", help=f"{what} into this PNG file (needs the plot extra: matplotlib)")
    group.add_argument("--svg", help=f"{what} into this SVG file (needs the plot extra: matplotlib)")


def _add_plan_source(p: argparse.ArgumentParser) -> None:
    _add_logging(p, top=False)
    p.add_argument("--plan", required=True, help="plan JSON written by `planner plan --json`")
    p.add_argument("--model", help="model of the plan (default: the plan's 'source')")
    p.add_argument("--batch", type=_positive_int, help="global batch (default: the plan's 'source')")
    p.add_argument("--seq", type=_positive_int, help="sequence length (default: the plan's 'source')")
