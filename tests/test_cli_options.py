"""Every command and every option: a run shows the option's effect, or the option is refused (exit
2).

Each row runs ``planner.cli.main`` in-process in a temporary directory and checks what the option
changed (a file written, a field of the plan, a status, a value passed to the search)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pandas as pd
import pytest

from planner import api, api3d
from planner.cli import main

GPT = "gpt:layers=4,hidden=256,heads=4,seq=64,vocab=512"  # a small pipelinable model
# imported; its exact plan on 4 is Megatron in the MLP
LLAMA = "hf:llama:hidden=512,ffn=1024,batch=1,seq=16"
LLAMA_REORDERED = "hf:llama:seq=16,batch=1,ffn=1024,hidden=512"  # the same module


def _with(**changes) -> api.TrainingSettings:
    return dataclasses.replace(api.TrainingSettings(), **changes)


def _activations(plan) -> float:
    return dict(plan.memory_breakdown)["activations"]


def _json(tmp: Path, name: str = "out.json") -> dict:
    return json.loads((tmp / name).read_text())


def _csv(tmp: Path, name: str = "out.csv") -> pd.DataFrame:
    return pd.read_csv(tmp / name)


TABLE = (
    "device,peak_bf16_flops,hbm_bytes,hbm_bandwidth,intra_node_link,"
    "intra_node_bandwidth,gpus_per_node,"
    "inter_node_link,inter_node_bandwidth_per_gpu\ntiny,1e12,1e9,1e11,x,1e10,4,y,1e9\n"
)

# (id, argv, exit code, check(tmp, captured search arguments, stdout))
CASES = [
    (
        "plan --model zoo",
        ["plan", "--model", "mlp", "--json", "out.json"],
        0,
        lambda t, c, o: _json(t)["model"] == "mlp",
    ),
    (
        "plan --mesh",
        ["plan", "--model", "mlp", "--mesh", "2x4", "--json", "out.json"],
        0,
        lambda t, c, o: _json(t)["mesh"] == "node=2,gpu=4",
    ),
    (
        "plan --device",
        ["plan", "--model", "mlp", "--device", "h100-80g", "--json", "out.json"],
        0,
        lambda t, c, o: _json(t)["device"] == "h100-80g",
    ),
    (
        "plan --hardware",
        [
            "plan",
            "--model",
            "mlp",
            "--hardware",
            "hw.csv",
            "--device",
            "tiny",
            "--json",
            "out.json",
        ],
        0,
        lambda t, c, o: _json(t)["device"] == "tiny" and _json(t)["memory_limit_bytes"] == 1e9,
    ),
    (
        "plan --batch",
        ["plan", "--model", GPT, "--batch", "16", "--json", "out.json"],
        0,
        lambda t, c, o: _json(t)["source"]["batch"] == 16 and c["graph_batch"] == 16,
    ),
    (
        "plan --seq",
        [
            "plan",
            "--model",
            "gpt2-small",
            "--seq",
            "128",
            "--batch",
            "8",
            "--method",
            "dp",
            "--json",
            "out.json",
        ],
        0,
        lambda t, c, o: _json(t)["source"]["seq"] == 128 and c["graph_seq"] == 128,
    ),
    (
        "plan --memory",
        ["plan", "--model", "mlp", "--memory", "40GB", "--json", "out.json"],
        0,
        lambda t, c, o: _json(t)["memory_limit_bytes"] == 40e9,
    ),
    (
        "plan --memory infeasible",
        ["plan", "--model", "gpt2-small", "--memory", "1MB", "--json", "out.json"],
        3,
        lambda t, c, o: not (t / "out.json").exists(),
    ),
    (
        "plan --dtype",
        ["plan", "--model", "mlp", "--dtype", "fp32", "--json", "out.json"],
        0,
        lambda t, c, o: _json(t)["settings"]["dtype"] == "fp32",
    ),
    (
        "plan --optimizer",
        ["plan", "--model", "mlp", "--optimizer", "sgd", "--json", "out.json"],
        0,
        lambda t, c, o: _json(t)["settings"]["optimizer"] == "sgd",
    ),
    (
        "plan --zero",
        ["plan", "--model", "mlp", "--zero", "3", "--json", "out.json"],
        0,
        lambda t, c, o: _json(t)["settings"]["zero"] == 3,
    ),
    (
        "plan --recompute",
        ["plan", "--model", "mlp", "--recompute", "full", "--json", "out.json"],
        0,
        lambda t, c, o: _json(t)["settings"]["recompute"] == "full",
    ),
    (
        "plan --recompute auto",
        [
            "plan",
            "--model",
            GPT,
            "--batch",
            "64",
            "--memory",
            "20MB",
            "--recompute",
            "auto",
            "--json",
            "out.json",
        ],
        0,
        lambda t, c, o: (
            _json(t)["settings"]["recompute"] == "auto"
            and _json(t)["settings"]["layer_recompute"]
            and "recompute per layer" in o
            and api.plan(GPT, batch=64, memory=20e6).status == "INFEASIBLE"
        ),
    ),
    (
        "plan --zero auto",
        [
            "plan",
            "--model",
            GPT,
            "--batch",
            "64",
            "--memory",
            "30MB",
            "--zero",
            "auto",
            "--json",
            "out.json",
        ],
        0,
        lambda t, c, o: (
            _json(t)["settings"]["zero"] == "auto"
            and _json(t)["settings"]["layer_zero"]
            and "ZeRO stage per layer" in o
            and _json(t)["objective"] < api.plan(GPT, batch=64, memory=30e6).objective
        ),
    ),
    (
        "plan --zero auto heuristic",
        ["plan", "--model", GPT, "--method", "dp", "--zero", "auto"],
        2,
        None,
    ),
    (
        "plan --zero auto pipeline",
        ["plan", "--model", GPT, "--pipeline", "auto", "--zero", "auto"],
        2,
        None,
    ),
    (
        "plan --recompute auto heuristic",
        ["plan", "--model", GPT, "--method", "megatron", "--recompute", "auto"],
        2,
        None,
    ),
    (
        "plan --recompute auto pipeline",
        ["plan", "--model", GPT, "--pipeline", "auto", "--recompute", "auto"],
        2,
        None,
    ),
    (
        "plan --recompute selective",
        [
            "plan",
            "--model",
            GPT + ",dropout=1",
            "--method",
            "megatron",
            "--recompute",
            "selective",
            "--json",
            "out.json",
        ],
        0,
        lambda t, c, o: (
            _json(t)["settings"]["recompute"] == "selective"
            and _activations(
                api.plan(GPT + ",dropout=1", method="megatron", settings=_with(recompute="full"))
            )
            < _json(t)["memory_breakdown_bytes"]["activations"]
            < _activations(api.plan(GPT + ",dropout=1", method="megatron"))
        ),
    ),
    (
        "plan --sequence-parallel",
        [
            "plan",
            "--model",
            GPT,
            "--mesh",
            "2",
            "--method",
            "megatron",
            "--sequence-parallel",
            "--json",
            "out.json",
        ],
        0,
        lambda t, c, o: (
            _json(t)["settings"]["sequence_parallel"] is True
            and _json(t)["memory_breakdown_bytes"]["activations"]
            < _activations(api.plan(GPT, "2", method="megatron"))
        ),
    ),
    (
        "plan --overlap",
        ["plan", "--model", "mlp", "--method", "dp", "--overlap", "none", "--json", "out.json"],
        0,
        lambda t, c, o: (
            _json(t)["settings"]["overlap"] == "none"
            and _json(t)["hidden_s"] == 0
            and api.plan("mlp", method="dp").hidden_s > 0
        ),
    ),
    (
        "plan --bucket-mb",
        ["plan", "--model", "mlp", "--method", "dp", "--bucket-mb", "0", "--json", "out.json"],
        0,
        lambda t, c, o: (
            _json(t)["settings"]["bucket_mb"] == 0
            and _json(t)["comm_s"] > api.plan("mlp", method="dp").comm_s
        ),
    ),
    (
        "plan --bucket-mb negative",
        ["plan", "--model", "mlp", "--bucket-mb", "-1"],
        2,
        lambda t, c, o: True,
    ),
    (
        "plan --fp32-grads",
        ["plan", "--model", "mlp", "--method", "dp", "--fp32-grads", "--json", "out.json"],
        0,
        lambda t, c, o: (
            _json(t)["settings"]["fp32_grads"] is True
            and _json(t)["memory_breakdown_bytes"]["grads"]
            == 2 * dict(api.plan("mlp", method="dp").memory_breakdown)["grads"]
        ),
    ),
    (
        "plan --csv",
        ["plan", "--model", "mlp", "--csv", "out.csv"],
        0,
        lambda t, c, o: len(_csv(t)) == 1,
    ),
    (
        "plan --no-timings",
        ["plan", "--model", "mlp", "--no-timings", "--json", "out.json", "--csv", "out.csv"],
        0,
        lambda t, c, o: "search_time_s" not in _json(t) and "search_time_s" not in _csv(t),
    ),
    (
        "plan --method",
        ["plan", "--model", "mlp", "--method", "megatron", "--json", "out.json"],
        0,
        lambda t, c, o: _json(t)["method"] == "megatron",
    ),
    # less loading and costing
    (
        "plan --time-limit --seed --jobs",
        ["plan", "--model", "mlp", "--time-limit", "7", "--seed", "5", "--jobs", "2"],
        0,
        lambda t, c, o: 6.0 < c["time_limit_s"] <= 7.0 and (c["seed"], c["jobs"]) == (5, 2),
    ),
    ("plan --seed too large", ["plan", "--model", "mlp", "--seed", str(2**31)], 2, None),
    (
        "plan --require-optimal",
        ["plan", "--model", "mlp", "--require-optimal", "--json", "out.json"],
        4,
        lambda t, c, o: _json(t)["status"] == "FEASIBLE",
    ),
    ("plan FEASIBLE without --require-optimal", ["plan", "--model", "mlp"], 0, None),
    (
        "plan --schedule without pipeline",
        ["plan", "--model", "mlp", "--schedule", "gpipe"],
        2,
        None,
    ),
    ("plan --pp without pipeline", ["plan", "--model", "mlp", "--pp", "2"], 2, None),
    (
        "plan --num-microbatches without pipeline",
        ["plan", "--model", "mlp", "--num-microbatches", "2"],
        0,
        lambda tmp, cap, out: (
            "gradient accumulation: 2 micro-batches" in out and cap["graph_batch"] == 4096 // 2
        ),
    ),
    (
        "plan --pipeline-method without pipeline",
        ["plan", "--model", "mlp", "--pipeline-method", "even"],
        2,
        None,
    ),
    ("plan --cuts without pipeline", ["plan", "--model", "mlp", "--cuts", "2"], 2, None),
    (
        "plan --for",
        ["plan", "--model", GPT, "--mesh", "2x2", "--for", "megatron", "--json", "out.json"],
        0,
        # the engine's search: Megatron-LM's stage plans, fp32 main gradients under bf16
        lambda t, c, o: (
            _json(t)["settings"]["fp32_grads"] is True
            and _json(t)["intra_method"] in ("megatron-grid", "megatron", "dp")
        ),
    ),
    (
        "plan --pipeline auto --json --csv",
        [
            "plan",
            "--model",
            GPT,
            "--mesh",
            "2x2",
            "--pipeline",
            "auto",
            "--json",
            "out.json",
            "--csv",
            "out.csv",
        ],
        0,
        lambda t, c, o: (
            _json(t)["format"] == "planner-3d/2"
            and _csv(t)["iteration_time_s"][0] == _json(t)["iteration_time_s"]
        ),
    ),
    (
        "plan --pipeline auto --no-timings",
        [
            "plan",
            "--model",
            GPT,
            "--mesh",
            "2x2",
            "--pipeline",
            "auto",
            "--no-timings",
            "--json",
            "out.json",
            "--csv",
            "out.csv",
        ],
        0,
        lambda t, c, o: "search_time_s" not in _json(t) and "search_time_s" not in _csv(t),
    ),
    (
        "plan --pipeline auto --time-limit --seed --jobs --method",
        [
            "plan",
            "--model",
            GPT,
            "--mesh",
            "2x2",
            "--pipeline",
            "auto",
            "--time-limit",
            "9",
            "--seed",
            "3",
            "--jobs",
            "2",
            "--method",
            "greedy",
        ],
        0,
        lambda t, c, o: (
            (c["time_limit_s"], c["seed"], c["jobs"], c["method"]) == (9.0, 3, 2, "greedy")
        ),
    ),
    (
        "plan --pipeline auto --require-optimal",
        ["plan", "--model", GPT, "--mesh", "2x2", "--pipeline", "auto", "--require-optimal"],
        4,
        None,
    ),
    (
        "plan --pipeline auto --schedule --pp --num-microbatches --pipeline-method",
        [
            "plan",
            "--model",
            GPT,
            "--mesh",
            "2x2",
            "--pipeline",
            "auto",
            "--schedule",
            "gpipe",
            "--pp",
            "2",
            "--num-microbatches",
            "4",
            "--pipeline-method",
            "exact",
            "--json",
            "out.json",
        ],
        0,
        lambda t, c, o: (
            {
                k: _json(t)["pipeline"][k]
                for k in ("schedule", "stages", "num_microbatches", "method")
            }
            == {"schedule": "gpipe", "stages": 2, "num_microbatches": 4, "method": "exact"}
        ),
    ),
    (
        "plan --pipeline auto --cuts",
        [
            "plan",
            "--model",
            GPT,
            "--mesh",
            "2x2",
            "--pipeline",
            "auto",
            "--pp",
            "2",
            "--cuts",
            "1",
            "--json",
            "out.json",
        ],
        0,
        lambda t, c, o: _json(t)["pipeline"]["cuts"] == [1],
    ),
    (
        "plan --pipeline auto --cuts without --pp",
        ["plan", "--model", GPT, "--mesh", "2x2", "--pipeline", "auto", "--cuts", "1"],
        2,
        None,
    ),
    (
        "plan --pipeline auto infeasible",
        [
            "plan",
            "--model",
            GPT,
            "--mesh",
            "2x2",
            "--pipeline",
            "auto",
            "--memory",
            "1KB",
            "--json",
            "out.json",
        ],
        3,
        lambda t, c, o: not (t / "out.json").exists(),
    ),
    (
        "plan --pipeline auto default mesh",
        ["plan", "--model", GPT, "--pipeline", "auto", "--json", "out.json"],
        0,
        lambda t, c, o: _json(t)["mesh"] == "gpu=8",
    ),
    (
        "pipeline --devices",
        ["pipeline", "--model", GPT, "--devices", "16", "--json", "out.json"],
        0,
        lambda t, c, o: _json(t)["mesh"] == "node=2,gpu=8",
    ),
    (
        "pipeline --method dp",
        ["pipeline", "--model", GPT, "--mesh", "2x2", "--method", "dp", "--json", "out.json"],
        0,
        lambda t, c, o: _json(t)["intra_method"] == "dp",
    ),
    (
        "compare --methods --json --csv",
        [
            "compare",
            "--model",
            "mlp",
            "--methods",
            "exact,dp",
            "--json",
            "out.json",
            "--csv",
            "out.csv",
        ],
        0,
        lambda t, c, o: (
            [r["method"] for r in _json(t)["rows"]] == ["exact", "dp"]
            and list(_csv(t)["method"]) == ["exact", "dp"]
        ),
    ),
    (
        "compare --no-timings",
        ["compare", "--model", "mlp", "--methods", "dp", "--no-timings", "--csv", "out.csv"],
        0,
        lambda t, c, o: "search_time_s" not in _csv(t),
    ),
    (
        "compare --time-limit --seed",
        ["compare", "--model", "mlp", "--methods", "exact", "--time-limit", "8", "--seed", "4"],
        0,
        lambda t, c, o: (c["time_limit_s"], c["seed"]) == (8.0, 4),
    ),
    (
        "evaluate --plan",
        ["evaluate", "--plan", "flat.json", "--json", "out.json"],
        0,
        lambda t, c, o: (
            _json(t)["objective"] == _json(t, "flat.json")["objective"]
            and _json(t)["mesh"] == "node=2,gpu=4"
        ),
    ),
    ("evaluate --plan --mesh differs", ["evaluate", "--plan", "flat.json", "--mesh", "8"], 2, None),
    ("evaluate --plan --tp", ["evaluate", "--plan", "flat.json", "--tp", "2"], 2, None),
    (
        "evaluate --plan --memory",
        ["evaluate", "--plan", "flat.json", "--memory", "1MB"],
        3,  # the plan does not fit: exit 3 with the report, as every command
        lambda t, c, o: "of 0.95 MiB" in o,
    ),
    (
        "evaluate --plan 3D",
        ["evaluate", "--plan", "p3.json", "--json", "out.json", "--csv", "out.csv"],
        0,
        lambda t, c, o: (
            _json(t)["iteration_time_s"] == _json(t, "p3.json")["iteration_time_s"]
            and len(_csv(t)) == 1
        ),
    ),
    (
        "plan --memory-headroom",
        ["plan", "--model", "mlp", "--memory-headroom", "8GiB", "--json", "out.json"],
        0,
        # a100-80g: 80 GB less its 2 GB reserve, less the headroom
        lambda t, c, o: _json(t)["memory_limit_bytes"] == 78e9 - 8 * 2**30,
    ),
    (
        "plan --memory-headroom above the limit",
        ["plan", "--model", "mlp", "--memory", "1GiB", "--memory-headroom", "2GiB"],
        2,
        None,
    ),
    (
        "compare --loss-kernel flat",
        ["compare", "--model", "mlp", "--methods", "dp", "--loss-kernel", "fused"],
        2,
        None,
    ),
    ("pareto --loss-kernel flat", ["pareto", "--model", "mlp", "--loss-kernel", "fused"], 2, None),
    (
        "compare --memory-headroom above the limit",
        ["compare", "--model", "mlp", "--methods", "dp", "--memory-headroom", "80GB"],
        2,
        None,
    ),
    (
        "pareto --memory-headroom above the limit",
        ["pareto", "--model", "mlp", "--memory-headroom", "80GB"],
        2,
        None,
    ),
    (
        "evaluate --loss-kernel",
        ["evaluate", "--model", GPT, "--tp", "2", "--loss-kernel", "fused", "--json", "out.json"],
        0,
        # megatron-core's in-place kernel: no buffer beside the saved softmax (PyTorch's: two)
        lambda t, c, o: (
            _json(t)["settings"]["loss_kernel"] == "fused"
            and _json(t)["stages"][0]["working_bytes"] == 0
            and api3d.evaluate_3d(GPT, tp=2, pp=1, dp=1, fit_required=False)
            .stage_details[0]
            .working_bytes
            > 0
        ),
    ),
    (
        "plan --loss-kernel flat",
        ["plan", "--model", "mlp", "--loss-kernel", "loss-parallel"],
        2,
        None,
    ),
    (
        "evaluate --tp --dp --pp --micro-batch --schedule",
        [
            "evaluate",
            "--model",
            GPT,
            "--batch",
            "16",
            "--tp",
            "2",
            "--dp",
            "2",
            "--pp",
            "2",
            "--micro-batch",
            "2",
            "--schedule",
            "gpipe",
            "--json",
            "out.json",
        ],
        0,
        lambda t, c, o: (
            (
                _json(t)["mesh"],
                _json(t)["pipeline"]["num_microbatches"],
                _json(t)["pipeline"]["schedule"],
            )
            == ("pp=2,dp=2,tp=2", 4, "gpipe")
        ),
    ),
    (
        "evaluate --from-megatron",
        ["evaluate", "--from-megatron", "mt.sh", "--json", "out.json"],
        0,
        lambda t, c, o: (
            _json(t)["iteration_time_s"] == _json(t, "mt.json")["iteration_time_s"]
            and _json(t)["mesh"] == "pp=1,dp=2,tp=2"
        ),
    ),
    (
        "evaluate --from-megatron --dp",
        ["evaluate", "--from-megatron", "mt_args.txt", "--dp", "1", "--json", "out.json"],
        0,
        lambda t, c, o: _json(t)["mesh"] == "pp=1,tp=2",
    ),
    ("evaluate --from-megatron no world", ["evaluate", "--from-megatron", "mt_args.txt"], 2, None),
    (
        "evaluate --from-megatron --compare-best",
        ["evaluate", "--from-megatron", "mt.sh", "--compare-best"],
        0,
        lambda t, c, o: "best Megatron-LM configuration the 3D search finds" in o,
    ),
    ("evaluate --compare-best alone", ["evaluate", "--plan", "p3.json", "--compare-best"], 2, None),
    # reading a torchtitan config imports torchtitan (tests/test_torchtitan.py, in a process of its
    # own); these rows are refused before it is imported
    (
        "evaluate --from-torchtitan --zero refused",
        ["evaluate", "--from-torchtitan", "t.py", "--zero", "1"],
        2,
        None,
    ),
    ("evaluate --config alone", ["evaluate", "--plan", "p3.json", "--config", "x"], 2, None),
    (
        "evaluate --from-megatron --tp refused",
        ["evaluate", "--from-megatron", "mt.sh", "--tp", "2"],
        2,
        None,
    ),
    (
        "evaluate --cuts",
        ["evaluate", "--model", GPT, "--pp", "2", "--cuts", "3", "--json", "out.json"],
        0,
        lambda t, c, o: _json(t)["pipeline"]["cuts"] == [3],
    ),
    (
        "evaluate gradient accumulation",
        [
            "evaluate",
            "--model",
            GPT,
            "--batch",
            "16",
            "--dp",
            "2",
            "--micro-batch",
            "2",
            "--json",
            "out.json",
        ],
        0,
        lambda t, c, o: (
            _json(t)["pipeline"]["num_microbatches"] == 4 and _json(t)["pipeline"]["stages"] == 1
        ),
    ),
    (
        "evaluate --mesh with degrees",
        ["evaluate", "--model", GPT, "--tp", "2", "--mesh", "2"],
        2,
        None,
    ),
    (
        "export --tensor-axis --json",
        ["export", "--plan", "flat.json", "--tensor-axis", "node", "--json", "out.json"],
        0,
        lambda t, c, o: _json(t)["parallelize_plan"]["mesh_axis"] == "node",
    ),
    ("export 3D refused", ["export", "--plan", "p3.json"], 2, None),
    (
        "export --target megatron --out",
        ["export", "--plan", "mt.json", "--target", "megatron", "--out", "l.sh"],
        0,
        lambda t, c, o: (
            "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 1"
            in (t / "l.sh").read_text()
            and "+0.000% against the plan" in o
        ),
    ),
    (
        "export --target megatron prints",
        ["export", "--plan", "mt.json", "--target", "megatron"],
        0,
        lambda t, c, o: "torchrun --nnodes 1 --nproc-per-node 4 pretrain_gpt.py" in o,
    ),
    (
        "export --target torchtitan --out",
        ["export", "--plan", "tt.json", "--target", "torchtitan", "--out", "t.py"],
        0,
        lambda t, c, o: (
            "p.data_parallel_shard_degree = 4" in (t / "t.py").read_text()
            and "+0.000% against the plan" in o
        ),
    ),
    (
        "export --target torchtitan no --out",
        ["export", "--plan", "tt.json", "--target", "torchtitan"],
        2,
        None,
    ),
    (
        "export --target megatron flat refused",
        ["export", "--plan", "flat.json", "--target", "megatron"],
        2,
        None,
    ),
    (
        "export --target torch 3D of a zoo model",
        ["export", "--plan", "p3.json", "--target", "torch", "--out", "p.py"],
        2,
        None,
    ),
    (
        "export --target torch --out",
        ["export", "--plan", "tp.json", "--target", "torch", "--out", "p.py"],
        0,
        lambda t, c, o: (
            "ColwiseParallel(" in (t / "p.py").read_text()
            and f"MODULE = {LLAMA!r}" in (t / "p.py").read_text()
        ),
    ),
    (
        "export --target jax --out",
        ["export", "--plan", "flat.json", "--target", "jax", "--out", "p.py"],
        0,
        lambda t, c, o: (
            "PARAM_SPECS = {" in (t / "p.py").read_text() and "P(" in (t / "p.py").read_text()
        ),
    ),
    (
        "export --module",
        [
            "export",
            "--plan",
            "tp.json",
            "--target",
            "torch",
            "--module",
            LLAMA_REORDERED,
            "--out",
            "p.py",
        ],
        0,
        lambda t, c, o: f"MODULE = {LLAMA_REORDERED!r}" in (t / "p.py").read_text(),
    ),
    (
        "export --module of another model",
        [
            "export",
            "--plan",
            "tp.json",
            "--target",
            "torch",
            "--module",
            "hf:gpt2:layers=1,hidden=64,heads=2,vocab=128,seq=16",
            "--out",
            "p.py",
        ],
        2,
        None,
    ),
    (
        "export --target torch of a zoo model",
        ["export", "--plan", "flat.json", "--target", "torch", "--out", "p.py"],
        2,
        None,
    ),
    (
        "export --out with --target json",
        ["export", "--plan", "flat.json", "--out", "p.py"],
        2,
        None,
    ),
    (
        "export --target torch --json",
        ["export", "--plan", "tp.json", "--target", "torch", "--json", "x.json"],
        2,
        None,
    ),
    ("run-torch --plan missing .py", ["run-torch", "--plan", "missing.py"], 2, None),
    ("verify --devices mismatch", ["verify", "--plan", "flat.json", "--devices", "4"], 2, None),
    ("verify --max-memory", ["verify", "--plan", "flat.json", "--max-memory", "1KB"], 2, None),
    (
        "verify --torch",
        ["verify", "--plan", "flat.json", "--no-xla", "--no-numpy", "--torch"],
        0,
        lambda t, c, o: "CommDebugMode" in o and "XLA" not in o and "numpy" not in o,
    ),
    (
        "verify --no-xla",
        ["verify", "--plan", "flat.json", "--no-xla"],
        0,
        lambda t, c, o: "numpy executor" in o and "XLA" not in o,
    ),
    (
        "compare common options",
        [
            "compare",
            "--model",
            "mlp",
            "--methods",
            "dp",
            "--mesh",
            "2x2",
            "--hardware",
            "hw.csv",
            "--device",
            "tiny",
            "--memory",
            "2e9",
            "--dtype",
            "fp16",
            "--optimizer",
            "sgd",
            "--zero",
            "1",
            "--recompute",
            "full",
            "--overlap",
            "grad",
            "--bucket-mb",
            "4",
            "--fp32-grads",
            "--sequence-parallel",
            "--json",
            "out.json",
        ],
        0,
        lambda t, c, o: (
            {
                k: _json(t)["rows"][0][k]
                for k in (
                    "mesh",
                    "device",
                    "memory_limit_bytes",
                    "setting_dtype",
                    "setting_optimizer",
                    "setting_zero",
                    "setting_recompute",
                    "setting_overlap",
                    "setting_bucket_mb",
                    "setting_fp32_grads",
                    "setting_sequence_parallel",
                )
            }
            == {
                "mesh": "node=2,gpu=2",
                "device": "tiny",
                "memory_limit_bytes": 2e9,
                "setting_dtype": "fp16",
                "setting_optimizer": "sgd",
                "setting_zero": 1,
                "setting_recompute": "full",
                "setting_overlap": "grad",
                "setting_bucket_mb": 4.0,
                "setting_fp32_grads": True,
                "setting_sequence_parallel": True,
            }
        ),
    ),
    (
        "plan --top-k --json --csv",
        [
            "plan",
            "--model",
            "mlp",
            "--mesh",
            "2x2",
            "--top-k",
            "3",
            "--json",
            "out.json",
            "--csv",
            "out.csv",
            "--no-timings",
        ],
        0,
        lambda t, c, o: (
            _json(t)["format"] == "planner-top-k/1"
            and len(_json(t)["plans"]) == 3
            and list(_csv(t)["rank"]) == [1, 2, 3]
            and "search_time_s" not in _csv(t)
        ),
    ),
    (
        "plan --top-k --method dp",
        ["plan", "--model", "mlp", "--top-k", "2", "--method", "dp"],
        2,
        None,
    ),
    (
        "pareto --png",
        ["pareto", "--model", "mlp", "--mesh", "2x2", "--max-points", "2", "--png", "f.png"],
        0,
        lambda t, c, o: (t / "f.png").read_bytes()[:4] == b"\x89PNG",
    ),
    ("pareto --svg", ["pareto", "--model", "mlp", "--max-points", "1", "--svg", "f.png"], 2, None),
    (
        "pareto common options",
        [
            "pareto",
            "--model",
            "mlp",
            "--mesh",
            "2x2",
            "--hardware",
            "hw.csv",
            "--device",
            "tiny",
            "--memory",
            "2e9",
            "--dtype",
            "fp16",
            "--optimizer",
            "sgd",
            "--zero",
            "1",
            "--recompute",
            "full",
            "--overlap",
            "grad",
            "--bucket-mb",
            "4",
            "--fp32-grads",
            "--sequence-parallel",
            "--max-points",
            "2",
            "--time-limit",
            "8",
            "--seed",
            "3",
            "--no-timings",
            "--json",
            "out.json",
            "--csv",
            "out.csv",
        ],
        0,
        lambda t, c, o: (
            _json(t)["searches"] == 2
            and (c["time_limit_s"], c["seed"]) == (8.0, 3)
            and {k: _json(t)["points"][0][k] for k in ("mesh", "device", "memory_limit_bytes")}
            == {"mesh": "node=2,gpu=2", "device": "tiny", "memory_limit_bytes": 2e9}
            and _json(t)["points"][0]["settings"]["zero"] == 1
            and _json(t)["points"][0]["settings"]["bucket_mb"] == 4.0
            and _json(t)["points"][0]["settings"]["sequence_parallel"] is True
            and _json(t)["points"][0]["settings"]["dtype"] == "fp16"
            and "search_time_s" not in _csv(t)
        ),
    ),
    (
        "pipeline common and pipeline options",
        [
            "pipeline",
            "--model",
            GPT,
            "--mesh",
            "2x2",
            "--hardware",
            "hw.csv",
            "--device",
            "tiny",
            "--memory",
            "0.9e9",
            "--dtype",
            "fp16",
            "--optimizer",
            "sgd",
            "--zero",
            "1",
            "--recompute",
            "full",
            "--overlap",
            "grad",
            "--bucket-mb",
            "4",
            "--fp32-grads",
            "--sequence-parallel",
            "--loss-kernel",
            "fused",
            "--memory-headroom",
            "1e6",
            "--schedule",
            "gpipe",
            "--pp",
            "2",
            "--num-microbatches",
            "4",
            "--pipeline-method",
            "brute",
            "--time-limit",
            "6",
            "--seed",
            "2",
            "--jobs",
            "2",
            "--no-timings",
            "--json",
            "out.json",
            "--csv",
            "out.csv",
        ],
        0,
        lambda t, c, o: (
            (
                _json(t)["device"],
                _json(t)["memory_limit_bytes"],
                _json(t)["settings"],
                _json(t)["pipeline"]["method"],
                _json(t)["pipeline"]["stages"],
                "search_time_s" in _csv(t),
                c["time_limit_s"],
                c["seed"],
                c["jobs"],
            )
            == (
                "tiny",
                0.9e9 - 1e6,  # --memory less --memory-headroom
                {
                    "dtype": "fp16",
                    "optimizer": "sgd",
                    "zero": 1,
                    "recompute": "full",
                    "overlap": "grad",
                    "bucket_mb": 4.0,
                    "fp32_grads": True,
                    "sequence_parallel": True,
                    "loss_kernel": "fused",
                    "layer_recompute": "",
                    "layer_zero": "",
                },
                "brute",
                2,
                False,
                6.0,
                2,
                2,
            )
        ),
    ),
    (
        "pipeline --schedule interleaved",
        [
            "pipeline",
            "--model",
            GPT,
            "--mesh",
            "2x2",
            "--pp",
            "2",
            "--schedule",
            "interleaved:2",
            "--json",
            "out.json",
        ],
        0,
        lambda t, c, o: (
            _json(t)["pipeline"]["schedule"] == "interleaved:2"
            and _json(t)["iteration_time_s"]
            != api3d.plan_pipeline(GPT, "2x2", degrees=[2]).pipeline.iteration_time_s
        ),
    ),
    (
        "pipeline --schedule refused",
        ["pipeline", "--model", GPT, "--mesh", "2x2", "--schedule", "interleaved:1"],
        2,
        None,
    ),
    (
        "pipeline --cuts",
        [
            "pipeline",
            "--model",
            GPT,
            "--mesh",
            "2x2",
            "--pp",
            "2",
            "--cuts",
            "2",
            "--json",
            "out.json",
        ],
        0,
        lambda t, c, o: _json(t)["pipeline"]["cuts"] == [2],
    ),
    (
        "pipeline --require-optimal",
        ["pipeline", "--model", GPT, "--mesh", "2x2", "--require-optimal"],
        4,
        None,
    ),
    (
        "pipeline --certify, optimality required",
        ["pipeline", "--model", GPT, "--mesh", "2", "--batch", "2", "--certify"]
        + ["--require-optimal", "--json", "out.json"],
        0,
        lambda t, c, o: _json(t)["status"] == "OPTIMAL",
    ),
    (  # the stage solves are reported FEASIBLE: nothing certified, exit 4
        "pipeline --certify --require-optimal, a solve not proven",
        ["pipeline", "--model", GPT, "--mesh", "2", "--batch", "2", "--certify"]
        + ["--require-optimal"],
        4,
        None,
    ),
    (
        "plan --pipeline auto --certify",
        ["plan", "--model", GPT, "--mesh", "2", "--batch", "2", "--pipeline", "auto", "--certify"],
        0,
        lambda t, c, o: "): OPTIMAL" in o,
    ),
    ("plan --certify without pipeline", ["plan", "--model", "mlp", "--certify"], 2, None),
    (
        "evaluate common options",
        [
            "evaluate",
            "--model",
            GPT,
            "--tp",
            "2",
            "--hardware",
            "hw.csv",
            "--device",
            "tiny",
            "--dtype",
            "fp16",
            "--optimizer",
            "sgd",
            "--zero",
            "1",
            "--recompute",
            "full",
            "--overlap",
            "grad",
            "--bucket-mb",
            "4",
            "--fp32-grads",
            "--sequence-parallel",
            "--loss-kernel",
            "fused",
            "--memory-headroom",
            "1e6",
            "--no-timings",
            "--json",
            "out.json",
        ],
        0,
        lambda t, c, o: (
            (_json(t)["device"], _json(t)["settings"], "search_time_s" in _json(t))
            == (
                "tiny",
                {
                    "dtype": "fp16",
                    "optimizer": "sgd",
                    "zero": 1,
                    "recompute": "full",
                    "overlap": "grad",
                    "bucket_mb": 4.0,
                    "fp32_grads": True,
                    "sequence_parallel": True,
                    "loss_kernel": "fused",
                    "layer_recompute": "",
                    "layer_zero": "",
                },
                False,
            )
        ),
    ),
    (
        "compare --png",
        ["compare", "--model", "mlp", "--methods", "exact,dp", "--png", "out.png"],
        0,
        lambda t, c, o: (t / "out.png").read_bytes()[:4] == b"\x89PNG",
    ),
    (
        "compare --svg",
        ["compare", "--model", "mlp", "--methods", "dp", "--svg", "out.svg"],
        0,
        lambda t, c, o: "<svg" in (t / "out.svg").read_text(),
    ),
    (
        "show --plan --what --png",
        ["show", "--plan", "p3.json", "--what", "memory", "--png", "out.png"],
        0,
        lambda t, c, o: (t / "out.png").read_bytes()[:4] == b"\x89PNG" and "memory of p3.json" in o,
    ),
    (
        "show --svg",
        ["show", "--plan", "flat.json", "--what", "sharding", "--svg", "out.svg"],
        0,
        lambda t, c, o: "<svg" in (t / "out.svg").read_text(),
    ),
    (
        "show --text",
        ["show", "--plan", "p3.json", "--what", "schedule", "--text"],
        0,
        lambda t, c, o: "micro-batches" in o and "memory per device" not in o,
    ),
    (
        "show --png --svg refused",
        ["show", "--plan", "flat.json", "--png", "a.png", "--svg", "a.svg"],
        2,
        None,
    ),
    (
        "run-jax --steps --lr --seed",
        ["run-jax", "--plan", "flat.json", "--steps", "2", "--lr", "0.001", "--seed", "3"],
        0,
        lambda t, c, o: (
            "SGD lr 0.001" in o and o.count("\n   ") == 2 and "max relative difference" in o
        ),
    ),
    ("run-jax --devices mismatch", ["run-jax", "--plan", "flat.json", "--devices", "4"], 2, None),
    ("run-jax --max-memory", ["run-jax", "--plan", "flat.json", "--max-memory", "1KB"], 2, None),
    # JAX's mesh run of this plan equals the one-device run bit for bit: the threshold is printed
    (
        "run-jax --tolerance",
        ["run-jax", "--plan", "flat.json", "--steps", "1", "--tolerance", "0.25"],
        0,
        lambda t, c, o: "(tolerance 0.25)" in o,
    ),
    (
        "run-jax --tolerance negative",
        ["run-jax", "--plan", "flat.json", "--tolerance", "-1"],
        2,
        None,
    ),
    (
        "verify --no-xla --no-numpy",
        ["verify", "--plan", "flat.json", "--no-xla", "--no-numpy"],
        2,
        None,
    ),
    (
        "run-jax 3D",
        ["run-jax", "--plan", "p3.json", "--steps", "2"],
        0,
        lambda t, c, o: "stages of" in o and "cpu devices" in o and o.count("\n   ") == 2,
    ),
    ("run-jax 3D --devices mismatch", ["run-jax", "--plan", "p3.json", "--devices", "3"], 2, None),
    (
        "run-torch --steps --lr --seed --tolerance",
        [
            "run-torch",
            "--plan",
            "flat.json",
            "--steps",
            "2",
            "--lr",
            "0.001",
            "--seed",
            "3",
            "--tolerance",
            "0",
        ],
        5,
        lambda t, c, o: "8 gloo devices" in o and "SGD lr 0.001" in o and "CommDebugMode" in o,
    ),
    ("run-torch --nproc mismatch", ["run-torch", "--plan", "flat.json", "--nproc", "4"], 2, None),
    ("run-torch --max-memory", ["run-torch", "--plan", "p3.json", "--max-memory", "1KB"], 2, None),
    ("run-torch 3D --nproc mismatch", ["run-torch", "--plan", "p3.json", "--nproc", "3"], 2, None),
    ("models -q", ["models", "-q"], 0, lambda t, c, o: o == ""),
    ("models", ["models"], 0, lambda t, c, o: "gpt3-175b" in o),
]


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    """A flat plan and a 3D plan written by the CLI, shared by the evaluate/export/verify rows."""
    root = tmp_path_factory.mktemp("plans")
    flat, p3, llama, tp = (
        str(root / name) for name in ("flat.json", "p3.json", "llama.json", "tp.json")
    )
    megatron = str(root / "mt.sh")
    for argv in (
        ["plan", "--model", "mlp", "--mesh", "2x4", "--batch", "64", "--json", flat, "-q"],
        ["plan", "--model", GPT, "--mesh", "2x2", "--pipeline", "auto", "--json", p3, "-q"],
        ["import-torch", LLAMA, "--loss", "cross_entropy", "--json", llama, "-q"],
        ["plan", "--model", llama, "--mesh", "4", "--json", tp, "-q"],
        ["evaluate", "--model", GPT, "--tp", "2", "--dp", "2", "--json", str(root / "mt.json")],
        ["export", "--plan", str(root / "mt.json"), "--target", "megatron", "--out", megatron],
        [
            "evaluate",
            "--model",
            "llama3-8b",
            "--device",
            "h100-80g",
            "--batch",
            "256",
            "--tp",
            "8",
            "--pp",
            "2",
            "--dp",
            "4",
            "--micro-batch",
            "1",
            "--zero",
            "1",
            "--fp32-grads",
            "--loss-kernel",
            "loss-parallel",
            "--json",
            str(root / "tt.json"),
            "-q",
        ],
    ):
        assert main(argv) == 0, argv
    line = (root / "mt.sh").read_text().splitlines()[-1]
    (root / "mt_args.txt").write_text(line.split("pretrain_gpt.py", 1)[1])
    return root


# the slowest cases (a torch training run each, 20-25 s on 2 cores) run with -m slow
SLOW = {"verify --torch", "run-torch --steps --lr --seed --tolerance"}


@pytest.mark.parametrize(
    "case_id,argv,code,check",
    [pytest.param(*c, id=c[0], marks=[pytest.mark.slow] if c[0] in SLOW else []) for c in CASES],
)
def test_option(case_id, argv, code, check, plans, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "hw.csv").write_text(TABLE)
    for name in ("flat.json", "p3.json", "tp.json", "llama.json", "mt.json", "mt.sh", "tt.json"):
        (tmp_path / name).write_text((plans / name).read_text())
    (tmp_path / "mt_args.txt").write_text((plans / "mt_args.txt").read_text())
    captured = _spy(
        monkeypatch, force_feasible="require-optimal" in case_id or "FEASIBLE" in case_id
    )
    try:
        result = main(argv)
    except SystemExit as exc:  # argument errors
        result = exc.code
    assert result == code, capsys.readouterr().err
    out = capsys.readouterr().out
    if check is not None:
        assert check(tmp_path, captured, out)


def _spy(monkeypatch, force_feasible: bool) -> dict:
    """Record what the search receives; optionally report FEASIBLE to test --require-optimal."""
    captured: dict = {}
    real_plan_problem, real_make_problem = api.plan_problem, api.make_problem

    def plan_problem(
        problem, memory_limit, method="exact", time_limit_s=60.0, *, seed=0, jobs=1, progress=None
    ):
        captured.update(method=method, time_limit_s=time_limit_s, seed=seed, jobs=jobs)
        found = real_plan_problem(
            problem, memory_limit, method, time_limit_s, seed=seed, jobs=jobs, progress=progress
        )
        return (
            dataclasses.replace(found, status="FEASIBLE")
            if force_feasible and found.status == "OPTIMAL"
            else found
        )

    def make_problem(graph, cluster, settings=None, batch=None, seq=None, num_microbatches=1):
        problem = real_make_problem(graph, cluster, settings, batch, seq, num_microbatches)
        captured.update(
            graph_batch=problem.graph.tensors[0].shape[0],
            graph_seq=problem.graph.tensors[0].shape[1]
            if len(problem.graph.tensors[0].shape) > 1
            else None,
        )
        return problem

    # the 3D search's exact stage planner reads strategies without a Plan (api3d)
    real_exact = api3d._exact_strategies

    def exact_strategies(problem, time_limit_s, seed, jobs):
        captured.update(method="exact", time_limit_s=time_limit_s, seed=seed, jobs=jobs)
        chosen, status = real_exact(problem, time_limit_s, seed, jobs)
        return chosen, "FEASIBLE" if force_feasible and status == "OPTIMAL" else status

    monkeypatch.setattr(api, "plan_problem", plan_problem)
    monkeypatch.setattr(api, "make_problem", make_problem)
    monkeypatch.setattr(api3d, "_exact_strategies", exact_strategies)
    return captured


def test_every_option_of_every_command_has_a_row():
    """Each option of each command's parser appears in at least one row (or is a logging flag)."""
    from planner.cli.parser import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    covered = {(c[1][0], a) for c in CASES for a in c[1] if a.startswith("--")}
    skip = {
        "--help",
        "--verbose",
        "--quiet",
        "--debug",
        "--model",
        "--allow-unknown",
        "--batch",
        "--seq",
        "--tolerance",
        "--no-numpy",
    }
    # import-torch needs torch (tests/test_torch_import.py); verify --tolerance/--no-numpy:
    # tests/test_verify.py
    missing = []
    for name, command in sub.choices.items():
        if name == "import-torch":
            continue
        for action in command._actions:
            for flag in action.option_strings:
                if flag.startswith("--") and flag not in skip and (name, flag) not in covered:
                    missing.append(f"{name} {flag}")
    assert not missing, missing


def test_auto_plan_file_reads_back_with_its_layer_choices(tmp_path, monkeypatch):
    """A plan whose recompute and ZeRO stages were chosen per layer evaluates to the same objective
    from its file."""
    monkeypatch.chdir(tmp_path)
    argv = ["--model", GPT, "--batch", "64", "--memory", "20MB"]
    assert main(["plan", *argv, "--recompute", "auto", "--zero", "auto", "--json", "p.json"]) == 0
    assert main(["evaluate", "--plan", "p.json", *argv, "--json", "e.json"]) == 0
    planned, evaluated = _json(tmp_path, "p.json"), _json(tmp_path, "e.json")
    for field in ("layer_recompute", "layer_zero"):
        assert planned["settings"][field] == evaluated["settings"][field] != ""
    assert evaluated["objective"] == planned["objective"]
