"""Hardening 3: the invariants of ``tests/fuzz_invariants.py`` on generated inputs, and each
invariant against a deliberately broken build.

Generated (Hypothesis, fixed seeds): graph JSONs (random einsum operators and shapes, fan-outs, odd
names), topologies (mesh specs of 1-3 axes, named or not, with the node size of a drawn JSON profile
or datasheet table deciding which axes cross nodes), device profiles, training settings and option
combinations of ``plan`` and ``evaluate`` (pairs and triples), and plan JSONs derived from real
plans by small edits. Each case either exits 2 with one line naming the field, or satisfies every
invariant. The default run draws about 300 cases (``--fuzz-scale 1``); ``.ci/run`` passes
``--fuzz-scale 2`` (about 600; ``--fuzz-scale 8`` by hand: about 2,500).
"""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import fuzz_invariants as inv
from planner import api
from planner.cost.settings import TrainingSettings
from planner.ir.graph_json import graph_to_dict
from planner.zoo import load_model
from strategies_gen import COMPUTE_BOUND, graphs

DEVICES = ("a100-80g", "h100-80g", "symbolic", "custom", "table")
AXIS_NAMES = ("node", "gpu", "x", "y", "rack", "a0")
METHODS = ("exact", "whole", "dp", "megatron", "greedy", "sapp")
ODD = st.text(
    st.characters(
        min_codepoint=0x21,
        max_codepoint=0x2FFF,
        blacklist_categories=("Cs", "Cc", "Cf", "Co", "Cn", "Zs", "Zl", "Zp"),
    ),
    min_size=1,
    max_size=12,
)


def budget(request, base: int) -> int:
    return base * int(request.config.getoption("--fuzz-scale"))


def fuzzed(request, base: int):
    """Hypothesis settings of this suite: ``base`` x --fuzz-scale cases, fixed seeds, no
    database."""
    return settings(
        max_examples=budget(request, base),
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )


def _profile(draw) -> dict:
    return {
        "name": "custom",
        "peak_flops": draw(st.sampled_from((1e9, 1e12, 312e12))),
        "memory_bytes": draw(st.sampled_from((1e6, 1e9, 80e9))),
        "intra_node_bandwidth": draw(st.sampled_from((1e9, 300e9))),
        "inter_node_bandwidth": draw(st.sampled_from((1e9, 25e9))),
        "gpus_per_node": draw(st.sampled_from((1, 2, 4, 8))),
        "kernel_launch_s": draw(st.sampled_from((0.0, 5e-6))),
    }


def _hardware_table(draw) -> str:
    """A datasheet table of one device row, in the format of planner/cluster/data/hardware.csv."""
    values = [
        draw(st.sampled_from(v))
        for v in (
            ("125e12", "1e12"),
            ("16e9", "80e9"),
            ("900e9", "3e12"),
            ("150e9", "450e9"),
            ("1", "2", "4", "8"),
            ("0.39e9", "50e9"),
        )
    ]
    flops, hbm, hbm_bw, nvlink, per_node, net = values
    return (
        "device,peak_bf16_flops,hbm_bytes,hbm_bandwidth,intra_node_link,"
        "intra_node_bandwidth,gpus_per_node,"
        "inter_node_link,inter_node_bandwidth_per_gpu,sm_count,fp32_vector_flops\n"
        f"fuzzdev,{flops},{hbm},{hbm_bw},nvlink,{nvlink},{per_node},ib,{net},100,20e12\n"
    )


@st.composite
def topologies(draw) -> str:
    """A mesh spec of 1 to 3 axes, sizes 1-4 and 2 to 8 devices: unnamed (``2x2``) or named
    (``node=2,gpu=2``), and one in six with a repeated or non-identifier name (refused)."""
    # 2 first: Hypothesis draws towards the first value, and 1-device meshes have nothing to split
    sizes = draw(
        st.lists(st.sampled_from((2, 4, 1, 3)), min_size=1, max_size=3).filter(
            lambda s: 2 <= math.prod(s) <= 8
        )
    )
    form = draw(st.sampled_from(("x", "x", "named", "named", "named", "bad")))
    if form == "x":
        return "x".join(map(str, sizes))
    pool = AXIS_NAMES + (("1a", "gpu-0", "gpu") if form == "bad" else ())
    names = draw(
        st.lists(
            st.sampled_from(pool), min_size=len(sizes), max_size=len(sizes), unique=form != "bad"
        )
    )
    return ",".join(f"{name}={size}" for name, size in zip(names, sizes))


OPTION_VALUES = {
    "--dtype": ("fp32", "fp16"),
    "--optimizer": ("sgd",),
    "--zero": ("1", "2", "3", "auto"),
    "--recompute": ("full", "selective", "auto"),
    "--overlap": ("none", "grad"),
    "--bucket-mb": ("0", "1"),
    "--memory": ("20MB", "2MB", "none"),
    "--fp32-grads": (),
    "--method": METHODS[1:],
}


def _drawn_options(draw) -> list[str]:
    """Up to three settings or search options with drawn values (``--fp32-grads`` is a flag)."""
    options = draw(st.dictionaries(st.sampled_from(tuple(OPTION_VALUES)), st.none(), max_size=3))
    argv = []
    for option in sorted(options):
        argv += (
            [option]
            if option == "--fp32-grads"
            else [option, draw(st.sampled_from(OPTION_VALUES[option]))]
        )
    return argv


@st.composite
def plan_cases(draw):
    """A graph JSON (random operators, its op names made odd; or, one case in four, a small GPT with
    repeated layers and a tied embedding), a mesh, a device, settings and a method: the argv of
    ``planner plan`` and the files it needs."""
    if draw(st.integers(0, 3)) == 0:
        layers, hidden = draw(st.integers(1, 3)), draw(st.sampled_from((16, 32)))
        vocab = draw(st.sampled_from((32, 64)))
        spec = f"gpt:layers={layers},hidden={hidden},heads=2,seq=8,vocab={vocab}"
        graph = graph_to_dict(load_model(spec, draw(st.sampled_from((2, 4, 8)))))
    else:
        graph = graph_to_dict(draw(graphs(min_ops=2, max_ops=6)))
    if draw(st.booleans()):
        names = draw(
            st.lists(
                ODD, min_size=len(graph["operators"]), max_size=len(graph["operators"]), unique=True
            )
        )
        for op, name in zip(graph["operators"], names):
            op["name"] = name
    device = draw(st.sampled_from(DEVICES))
    argv = ["--mesh", draw(topologies()), "--device", "fuzzdev" if device == "table" else device]
    if device == "table":
        argv += ["--hardware", "table.csv"]
    argv += _drawn_options(draw)
    files = {"custom.json": json.dumps(_profile(draw))} if device == "custom" else {}
    if device == "table":
        files["table.csv"] = _hardware_table(draw)
    return graph, files, argv


def _materialise(files: dict[str, str], argv: list[str], work: Path) -> list[str]:
    """Write a case's files into ``work`` and point its argv at them (``custom`` is the profile)."""
    for name, text in files.items():
        (work / name).write_text(text)
    paths = {"custom": work / "custom.json", "table.csv": work / "table.csv"}
    return [str(paths[a]) if a in paths and paths[a].name in files else a for a in argv]


def _run_plan(case, work: Path):
    graph, files, argv = case
    (work / "g.json").write_text(json.dumps(graph))
    argv = [
        "plan",
        "--model",
        str(work / "g.json"),
        *_materialise(files, argv, work),
        "--json",
        str(work / "p.json"),
        "--no-timings",
        "--time-limit",
        "20",
    ]
    code, out, err = inv.cli(*argv)
    return argv, code, out, err


def test_plan_on_generated_graphs_keeps_every_invariant(request):
    """Invariants 0-3, 5 and 6 on about 120 generated `planner plan` cases (x --fuzz-scale)."""

    @fuzzed(request, 120)
    @given(plan_cases())
    def check(case):
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            argv, code, out, err = _run_plan(case, work)
            inv.refusal_is_one_line(code, err)
            assert code in (0, 2, 3), (code, err)
            plan_path = work / "p.json"
            written = json.loads(plan_path.read_text()) if plan_path.exists() else None
            inv.fits_are_true(code, written, plan_path)
            if code != 0:
                return
            inv.notes_agree_with_status(written)
            inv.recost_agrees(plan_path, work)
            if written["method"] == "exact":
                inv.status_is_earned(
                    written, _exact_problem(written, argv, case), written["memory_limit_bytes"], {}
                )
            first = plan_path.read_bytes()
            inv.same_bytes(argv, plan_path, first)
            # one case in ~8: a pool starts
            if written["method"] == "exact" and len(case[0]["operators"]) == 7:
                inv.same_bytes(argv, plan_path, first, jobs=2)

    check()


def _exact_problem(written: dict, argv: list[str], case):
    """The costed problem of a written plan (same model, mesh, device, settings)."""
    device = argv[argv.index("--device") + 1]
    table = argv[argv.index("--hardware") + 1] if "--hardware" in argv else None
    cluster = api.make_cluster(
        written["mesh"], device, written["memory_limit_bytes"] or math.inf, hardware_csv=table
    )
    return api.make_problem(written["source"]["model"], cluster, inv._settings(written["settings"]))


EDITS = {
    "objective": lambda d: d.__setitem__("objective", (d["objective"] or 0) + 1),
    "step time": lambda d: d.__setitem__(
        "estimated_step_time_s", d["estimated_step_time_s"] * 1.5 + 1e-6
    ),
    "memory": lambda d: d.__setitem__(
        "memory_per_device_bytes", d["memory_per_device_bytes"] + 4096
    ),
    "fits": lambda d: d.__setitem__("fits_memory", not d["fits_memory"]),
    "strategy": lambda d: d["operators"][0].__setitem__("strategy", {"zz": "q"}),
    "settings": lambda d: d["settings"].__setitem__("zero", 2.5),
    "limit": lambda d: d.__setitem__("memory_limit_bytes", 0),
    "no operators": lambda d: d.__setitem__("operators", []),
    "nan": lambda d: d.__setitem__("estimated_step_time_s", float("nan")),
}


def test_edited_plans_are_refused_by_their_consumers(request):
    """Invariant 7 on about 60 plans (x --fuzz-scale): a real plan with one small edit is refused
    by `show` and `export` (one line, exit 2), never drawn or exported."""

    @fuzzed(request, 60)
    @given(plan_cases(), st.sampled_from(sorted(EDITS)))
    def check(case, edit):
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            _, code, _, _ = _run_plan(case, work)
            if code != 0:
                return
            data = json.loads((work / "p.json").read_text())
            EDITS[edit](data)
            (work / "e.json").write_text(json.dumps(data))
            inv.consumers_check_the_plan(work / "e.json", ("show", "export"))

    check()


# options with a physical effect on a fixed Megatron-style configuration (evaluate --tp --dp)
EFFECTS = {
    "--dtype": ("fp32",),
    "--optimizer": ("sgd",),
    "--zero": ("1", "2", "3"),
    "--recompute": ("full", "selective"),
    "--fp32-grads": (None,),
    "--bucket-mb": ("0",),
    "--sequence-parallel": (None,),
    "--memory": ("1MB",),
}
# overlap none: gradient reduction is exposed, so its bucket and dtype show in the step time
BASE = [
    "evaluate",
    "--model",
    "gpt:layers=2,hidden=64,heads=4,seq=16,vocab=128",
    "--batch",
    "8",
    "--tp",
    "2",
    "--dp",
    "2",
    "--overlap",
    "none",
]


def test_every_option_given_changes_the_result_or_is_refused(request):
    """Invariant 4 on about 40 option pairs and triples (x --fuzz-scale): each option at a
    non-default value, added to the others, changes a figure of the result, or the run exits 2."""

    @fuzzed(request, 40)
    @given(
        st.lists(st.sampled_from(sorted(EFFECTS)), min_size=2, max_size=3, unique=True), st.data()
    )
    def check(options, data):
        chosen = [(o, data.draw(st.sampled_from(EFFECTS[o]))) for o in options]
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            for k in range(len(chosen)):
                others = [
                    w
                    for i, (o, v) in enumerate(chosen)
                    if i != k
                    for w in ((o,) if v is None else (o, v))
                ]
                option, value = chosen[k]
                base = _evaluate(work, "base.json", others)
                varied = _evaluate(
                    work, "varied.json", others + ([option] if value is None else [option, value])
                )
                inv.option_changes_result(
                    base[1], varied[1], varied[0], f"{option} {value or ''} with {others}", base[0]
                )

    check()


def _evaluate(work: Path, name: str, extra: list[str]) -> tuple[int, dict | None]:
    path = work / name
    path.unlink(missing_ok=True)
    code, _, err = inv.cli(*BASE, *extra, "--json", path, "--no-timings", "-q")
    inv.refusal_is_one_line(code, err)
    return code, json.loads(path.read_text()) if path.exists() else None


def test_exact_plans_equal_brute_force_and_beat_every_heuristic(request):
    """Invariant 2 where it is sharpest: about 40 generated graphs under a binding limit or none,
    the exact plan against brute force and against every heuristic method's fitting plan."""

    @fuzzed(request, 40)
    @given(
        graphs(min_ops=2, max_ops=5),
        st.sampled_from(("4", "2x2")),
        st.sampled_from((None, 0.6, 0.9)),
    )
    def check(graph, mesh, tight):
        # compute costs time here, so the optima split something (on a100-80g these tiny graphs
        # replicate: a planner that never shards would pass)
        cluster = api.make_cluster(mesh, COMPUTE_BOUND, math.inf)
        problem = api.make_problem(graph, cluster, TrainingSettings())
        assume(math.prod(len(t.strategies) for t in problem.ops) <= inv.BRUTE_LIMIT)
        from planner.search.fallback import min_memory

        free = api.plan_problem(problem, math.inf, "exact")
        limit = (
            math.inf
            if tight is None
            else max(min_memory(problem), int(free.memory_per_device_bytes * tight))
        )
        exact = api.plan_problem(problem, limit, "exact").to_dict()
        sharded.append(
            any(v is not None for o in exact["operators"] for v in o["strategy"].values())
        )
        others = {
            m: api.plan_problem(problem, limit, m).to_dict()
            for m in ("dp", "megatron", "greedy", "sapp")
        }
        inv.status_is_earned(exact, problem, limit, others)
        inv.notes_agree_with_status(exact)

    sharded: list[bool] = []
    check()
    assert len(sharded) >= budget(request, 40) // 2, (
        f"only {len(sharded)} cases passed the size filter"
    )
    assert sum(sharded) >= 0.6 * len(sharded), (
        f"only {sum(sharded)} of {len(sharded)} optima split an operator"
    )


GPT_TINY = "gpt:layers=4,hidden=64,heads=4,seq=16,vocab=128"


@st.composite
def pipeline_cases(draw):
    """`planner pipeline` (or `plan --pipeline auto`) with a drawn pair or triple of its options."""
    command = draw(st.sampled_from((["pipeline"], ["plan", "--pipeline", "auto"])))
    argv = [
        *command,
        "--model",
        GPT_TINY,
        "--batch",
        "8",
        "--mesh",
        draw(st.sampled_from(("node=2,gpu=2", "4", "2x2"))),
    ]
    choices = {
        "--schedule": ("gpipe", "1f1b", "interleaved:2"),
        "--pp": ("1", "2", "4"),
        "--num-microbatches": ("1", "2", "4", "3"),
        "--pipeline-method": ("csimd", "exact", "even", "brute"),
        "--cuts": ("2", "1,3"),
        "--zero": ("1", "3"),
        "--recompute": ("full",),
        "--memory": ("30MB", "none"),
        "--dtype": ("fp32",),
    }
    for option in sorted(draw(st.sets(st.sampled_from(sorted(choices)), min_size=2, max_size=3))):
        argv += [option, draw(st.sampled_from(choices[option]))]
    return argv


def test_pipeline_options_in_combination_keep_the_invariants(request):
    """Invariants 0, 1, 3 and 6 on about 15 pipeline option pairs and triples (x --fuzz-scale):
    refused in one line, or a 3D plan that re-costs to its iteration time, fits when it says so
    and is written byte for byte again."""

    @fuzzed(request, 15)
    @given(pipeline_cases())
    def check(argv):
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            path = work / "p.json"
            argv = argv + ["--json", str(path), "--no-timings", "-q"]
            code, _, err = inv.cli(*argv)
            inv.refusal_is_one_line(code, err)
            assert code in (0, 2, 3), (code, err)
            if code == 3:
                assert not path.exists()
            if code != 0:
                return
            written = json.loads(path.read_text())
            assert (
                written["fits_memory"] is False
                or written["memory_limit_bytes"] is None
                or written["max_memory_bytes"] <= written["memory_limit_bytes"]
            )
            inv.recost_agrees(path, work)
            inv.same_bytes(argv, path, path.read_bytes())

    check()


def test_compare_rows_keep_the_invariants(request):
    """Invariants 0, 2 and 3 on about 20 `planner compare` runs (x --fuzz-scale) of generated graphs
    with a drawn method list and settings: the exact row is never worse than a heuristic row that
    fits, a FEASIBLE row's gap is what it prints, a failed row carries no numbers."""

    @fuzzed(request, 20)
    @given(plan_cases(), st.sets(st.sampled_from(METHODS[1:]), min_size=1, max_size=3))
    def check(case, methods):
        graph, files, argv = case
        if "--method" in argv:
            i = argv.index("--method")
            argv = argv[:i] + argv[i + 2 :]
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            (work / "g.json").write_text(json.dumps(graph))
            argv = _materialise(files, argv, work)
            code, _, err = inv.cli(
                "compare",
                "--model",
                str(work / "g.json"),
                *argv,
                "--methods",
                ",".join(["exact", *sorted(methods)]),
                "--json",
                str(work / "c.json"),
                "--no-timings",
                "-q",
                "--time-limit",
                "20",
            )
            inv.refusal_is_one_line(code, err)
            assert code in (0, 2), (code, err)
            if code:
                return
            rows = {r["method"]: r for r in json.loads((work / "c.json").read_text())["rows"]}
            exact = rows["exact"]
            for method, row in rows.items():
                if row["status"] in ("INFEASIBLE", "UNKNOWN"):
                    assert row["objective"] is None and row["memory_per_device_bytes"] is None, row
                elif exact["status"] == "OPTIMAL" and row["fits_memory"]:
                    assert exact["objective"] <= row["objective"], (
                        method,
                        row["objective"],
                        exact["objective"],
                    )

    check()
