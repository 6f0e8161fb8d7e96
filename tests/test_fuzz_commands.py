"""Hardening 4: the invariants of ``tests/fuzz_invariants.py`` on the commands added since
hardening 3 (``plan --top-k``, ``pareto``, ``plan --method megatron-grid``, ``plan --for``,
``evaluate`` with degrees, ``evaluate --from-megatron`` on generated launch lines, ``export
--target megatron``) and the Python API added with them (``StageChain.cost``, ``Cluster``), and
each new invariant against a deliberately broken build.

Each generated command (a small GPT, a mesh of 2-4 devices, a memory limit that fits or not, files
that exist before the run) either exits 2 with one line naming an input the user gave, exits 3
with one line saying why and leaves the files as they were (invariants 0, 8, 9, 13), or succeeds
with plans that re-cost to their own figures (invariants 1, 3, 10, 11) and, for 3D plans, a launch
line that costs the same (14). Each generated API call returns or raises a PlannerError naming
one of its own parameters (12). About 150 commands and 50 API calls by default (x --fuzz-scale;
``.ci/run`` passes 10); top-k on 1-D meshes only (its no-good cuts wade through a 2-D mesh's
symmetric ties: 8-14 s a case).
"""

from __future__ import annotations

import functools
import inspect
import json
import math
import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import fuzz_invariants as inv
import planner
from planner import Cluster
from planner.cluster.cluster import make_cluster
from test_fuzz import fuzzed

COMMANDS = ("top-k", "pareto", "megatron-grid", "for", "evaluate", "from-megatron")
# launch-line flags: priced, inert, refused by name, misspelt, out of range
LAUNCH_FLAGS = (
    "",
    "--use-distributed-optimizer",
    "--sequence-parallel",
    "--recompute-granularity selective",
    "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1",
    "--recompute-granularity full --recompute-method block --recompute-num-layers 1",
    "--log-interval 10",
    "--use-flash-attn",
    "--tensor-model-parallel-sizes 2",
    "--context-parallel-size 2",
    "--num-layers-per-virtual-pipeline-stage 1",
    "--micro-batch-size 0",
    "--fp16",
)


@st.composite
def cases(draw) -> tuple[str, str, int, list[str]]:
    """(command, model, batch, argv without outputs)."""
    layers, hidden = draw(st.sampled_from((1, 2))), draw(st.sampled_from((16, 32)))
    model = f"gpt:layers={layers},hidden={hidden},heads=2,seq=8,vocab=64"
    batch = draw(st.sampled_from((4, 8)))
    mesh = draw(st.sampled_from(("2", "4", "2x2", "node=2,gpu=2")))
    memory = draw(st.sampled_from(([], ["--memory", "2000"], ["--memory", "64GB"])))
    command = draw(st.sampled_from(COMMANDS))
    if command == "top-k":
        # no-good cuts on a 2-D mesh wade through its symmetric ties: 8-14 s a case
        mesh = draw(st.sampled_from(("2", "4")))
    base = ["--model", model, "--batch", str(batch), *memory]
    if command == "from-megatron":
        launch = _launch(draw, layers, hidden)
        return command, model, batch, ["evaluate", *memory, "--from-megatron", launch]
    if command == "evaluate":
        dp = 2 if mesh == "2" else 4
        tp, dp = draw(st.sampled_from(((1, dp), (2, dp // 2))))
        argv = ["evaluate", *base, "--tp", str(tp), "--dp", str(dp), "--micro-batch", str(dp)]
    else:
        argv = ["plan" if command != "pareto" else "pareto", *base, "--mesh", mesh]
        argv += {
            "top-k": ["--top-k", str(draw(st.sampled_from((1, 2, 3))))],
            "pareto": ["--max-points", "3"],
            "megatron-grid": ["--method", "megatron-grid"],
            "for": ["--for", "megatron", "--pp", "1"],
        }.get(command, [])
    return command, model, batch, argv


def _launch(draw, layers: int, hidden: int) -> str:
    """A Megatron-LM launch line (its text; the case writes it to a file)."""
    world, tp, pp = draw(st.sampled_from(((2, 1, 1), (2, 2, 1), (4, 2, 1), (4, 1, 2), (4, 2, 2))))
    pp = pp if layers % pp == 0 else 1
    flags = " ".join(draw(st.lists(st.sampled_from(LAUNCH_FLAGS), max_size=2, unique=True)))
    return (
        f"torchrun --nnodes 1 --nproc-per-node {world} pretrain_gpt.py --num-layers {layers} "
        f"--hidden-size {hidden} --num-attention-heads 2 --seq-length 8 --vocab-size 64 "
        f"--micro-batch-size {draw(st.sampled_from((1, 2)))} "
        f"--global-batch-size {draw(st.sampled_from((8, 16)))} --bf16 "
        f"--tensor-model-parallel-size {tp} --pipeline-model-parallel-size {pp} {flags}"
    )


def _run(argv: list[str], work: Path) -> tuple[int, str, dict, Path]:
    out, table = work / "out.json", work / "out.csv"
    out.write_text('{"kept": true}\n')
    table.write_text("kept\n")
    before = {out: out.read_bytes(), table: table.read_bytes()}
    code, _, err = inv.cli(*argv, "--json", out, "--csv", table, "--no-timings", "-q")
    return code, err, before, out


def test_the_new_commands_keep_their_promises(request):
    @fuzzed(request, 150)
    @given(cases())
    def check(case):
        command, model, batch, argv = case
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            given_text = " ".join(argv)
            if command == "from-megatron":  # the line goes in a file, as a user's script does
                (work / "launch_in.sh").write_text(argv[-1])
                argv = [*argv[:-1], work / "launch_in.sh"]
            code, err, before, out = _run(argv, work)
            inv.refusal_is_one_line(code, err)
            inv.refusal_names_given_input(code, err, given_text)
            inv.infeasible_says_why(code, err)
            inv.failed_run_keeps_files(code, before)
            if code != 0:
                return
            if command in ("top-k", "pareto"):
                inv.ranked_plans_recost(out, model, batch)
                inv.entries_recost_by_evaluate(out, work)
                return
            inv.recost_agrees(out, work)
            inv.fits_are_true(code, json.loads(out.read_text()), out)
            if command in ("for", "from-megatron"):
                inv.launch_round_trips(out, work)

    check()


TINY = "gpt:layers=2,hidden=32,heads=2,seq=8,vocab=64"


def test_a_ranking_that_writes_on_failure_is_caught(tmp_path, monkeypatch):
    """Mutant: `plan --top-k` writes its (empty) JSON before it says nothing fits."""
    import planner.cli.front as front

    real = front.infeasible

    def writes_first(why, args):
        Path(args.json).write_text('{"plans": []}')
        return real(why, args)

    monkeypatch.setattr(front, "infeasible", writes_first)
    argv = ["plan", "--model", TINY, "--mesh", "2", "--batch", "4", "--memory", "2000"]
    code, err, before, _ = _run(argv + ["--top-k", "2"], tmp_path)
    assert code == 3
    with pytest.raises(AssertionError, match="was written"):
        inv.failed_run_keeps_files(code, before)


def test_a_silent_infeasible_exit_is_caught(tmp_path, monkeypatch):
    """Mutant: `pareto` exits 3 without a word when nothing fits."""
    import planner.cli.front as front

    monkeypatch.setattr(front, "infeasible", lambda why, args: 3)
    argv = ["pareto", "--model", TINY, "--mesh", "2", "--batch", "4", "--memory", "2000"]
    code, err, _, _ = _run(argv, tmp_path)
    with pytest.raises(AssertionError, match="exit 3 saying"):
        inv.infeasible_says_why(code, err)


@pytest.mark.parametrize("what", ["objective", "order", "dominated"])
def test_a_ranking_that_misreports_is_caught(what, tmp_path):
    """Mutants: a top-k rank written one unit cheaper than it costs, two ranks swapped, a Pareto
    point that another dominates."""
    command = ["pareto", "--max-points", "3"] if what == "dominated" else ["plan", "--top-k", "3"]
    argv = [command[0], "--model", TINY, "--mesh", "4", "--batch", "4", *command[1:]]
    code, _, _, out = _run(argv, tmp_path)
    assert code == 0
    data = json.loads(out.read_text())
    if what == "objective":
        data["plans"][0]["objective"] -= 1
    elif what == "order":
        data["plans"] = data["plans"][::-1]
    else:
        worse = dict(data["points"][0])
        worse["estimated_step_time_s"] *= 2
        data["points"].append(worse)
    out.write_text(json.dumps(data))
    with pytest.raises(AssertionError):
        inv.ranked_plans_recost(out, TINY, 4)


# values a script may pass, wrong in range or in type (each drawn one time in four)
BAD_CUTS = ((0,), (9,), (-1,), (1, 3), (2.0,), "2", None, (True,))
COUNTS, BAD_COUNTS = (None, 1, 2, 4), (3, 0, True, 2.0, "2")
SCHEDULES, BAD_SCHEDULES = ("1f1b", "gpipe", "interleaved:2"), ("bogus", None)
LIMITS, BAD_LIMITS = (math.inf, 1e9, 1e5), (-1.0, math.nan, None, True, "80GB")
STAGES, BAD_STAGES = (1, 2), (0, True, "2", 2.5)


def _pick(data, good: tuple, bad: tuple):
    return data.draw(st.sampled_from(good if data.draw(st.integers(0, 3)) else bad))


@functools.lru_cache(maxsize=None)
def _chain(model: str, mesh: str, stages, batch: int):
    """``layer_chain`` once per input (a chain is a search); None when it refused."""
    call = functools.partial(planner.layer_chain, model, mesh, stages=stages, batch=batch)
    return inv.python_error_names_parameter(call, _parameters(planner.layer_chain))


def _parameters(func) -> tuple[str, ...]:
    return tuple(inspect.signature(func).parameters)


def _stage_chain_call(data) -> None:
    """``layer_chain`` then ``StageChain.cost`` with drawn arguments (invariant 12); a cost that
    returns is GIVEN within its limit or INFEASIBLE over it, and the same cuts and count cost the
    same time with no limit."""
    layers = data.draw(st.sampled_from((2, 4)))
    model = (
        f"gpt:layers={layers},hidden={data.draw(st.sampled_from((16, 32)))},heads=2,seq=8,vocab=64"
    )
    mesh, batch = (
        data.draw(st.sampled_from(("2", "4", "node=2,gpu=2"))),
        data.draw(st.sampled_from((4, 8))),
    )
    chain = _chain(model, mesh, _pick(data, STAGES, BAD_STAGES), batch)
    if chain is None:
        return
    cuts = tuple(range(1, layers))[: chain.stages - 1] if chain.stages > 1 else ()
    args = {
        "cuts": _pick(data, (cuts,), BAD_CUTS),
        "num_microbatches": _pick(data, COUNTS, BAD_COUNTS),
        "schedule": _pick(data, SCHEDULES, BAD_SCHEDULES),
        "memory_limit": _pick(data, LIMITS, BAD_LIMITS),
    }
    parameters = _parameters(type(chain).cost)
    plan = inv.python_error_names_parameter(lambda: chain.cost(**args), parameters)
    if plan is None:
        return
    assert plan.status in ("GIVEN", "INFEASIBLE"), plan.status
    assert (plan.status == "GIVEN") == (plan.max_memory_bytes <= args["memory_limit"]), plan
    free = chain.cost(**{**args, "memory_limit": math.inf})
    assert free.status == "GIVEN" and free.iteration_time_s == plan.iteration_time_s


def _cluster_call(data) -> None:
    """A ``Cluster`` built by hand or by ``make_cluster`` from drawn values, then planned on
    (invariant 12 on each call; a plan that returns says whether it fits the Cluster's limit)."""
    good = make_cluster("4", "h100-80g")
    if data.draw(st.booleans()):
        values = {
            "mesh": _pick(data, (good.mesh,), ("4", None)),
            "profile": _pick(data, (good.profile,), ("h100-80g", None)),
            "memory_limit": _pick(data, LIMITS, BAD_LIMITS),
        }
        build, parameters = (lambda: Cluster(**values)), _parameters(Cluster)
    else:
        values = {
            "mesh": _pick(data, ("4", "2x2", "node=2,gpu=2", good), ("4x", "0", 4)),
            "device": _pick(data, ("h100-80g", "a100-80g", good.profile), ("nope", None)),
            "memory": _pick(data, (None, *LIMITS), BAD_LIMITS),
        }
        build, parameters = (lambda: planner.make_cluster(**values)), _parameters(make_cluster)
    cluster = inv.python_error_names_parameter(build, parameters)
    if cluster is None:
        return
    plan = inv.python_error_names_parameter(
        lambda: planner.plan(TINY, cluster, batch=4), _parameters(planner.plan)
    )
    if plan is not None and plan.status in ("OPTIMAL", "FEASIBLE"):
        limit = cluster.memory_limit
        assert plan.fits_memory == (plan.memory_per_device_bytes <= limit), plan.status


def test_the_python_api_keeps_its_promises(request):
    @fuzzed(request, 100)
    @given(st.data())
    def check(data):
        if data.draw(st.booleans()):
            _stage_chain_call(data)
        else:
            _cluster_call(data)

    check()


def test_a_ranking_entry_without_its_source_is_caught(tmp_path, monkeypatch):
    """Mutant: top-k entries written without the run's ``source`` (as before hardening 4):
    saved alone, ``evaluate --plan`` cannot re-cost them."""
    import planner.cli.front as front

    monkeypatch.setattr(front, "plan_source", lambda args: {})
    argv = ["plan", "--model", TINY, "--mesh", "2", "--batch", "4", "--top-k", "2"]
    code, _, _, out = _run(argv, tmp_path)
    assert code == 0
    with pytest.raises(AssertionError, match="exited 2"):
        inv.entries_recost_by_evaluate(out, tmp_path)


def test_an_api_error_that_names_a_flag_or_crashes_is_caught():
    """Mutants: ``StageChain.cost`` raising the cut search's message as it is (``--cuts: ...``),
    and a ``Cluster`` that takes a mesh spec it cannot use (an AttributeError in the search)."""
    chain = _chain(TINY, "4", 2, 4)
    raw = type(chain).cost.__wrapped__
    parameters = _parameters(raw)
    with pytest.raises(AssertionError, match="names .--cuts."):
        inv.python_error_names_parameter(lambda: raw(chain, (9,)), parameters)
    cluster = make_cluster("4", "h100-80g")
    unchecked = object.__new__(Cluster)  # a Cluster built without its checks
    for name, value in (("mesh", "4"), ("profile", cluster.profile), ("memory_limit", 1e9)):
        object.__setattr__(unchecked, name, value)
    with pytest.raises(AssertionError, match="instead of a PlannerError"):
        inv.python_error_names_parameter(
            lambda: planner.plan(TINY, unchecked, batch=4), _parameters(planner.plan)
        )


def test_a_refusal_that_names_an_input_not_given_is_caught(tmp_path, monkeypatch):
    """Mutant: the settings error reported with the library's field name mapped to another
    option than the one given (``--fp32-grads`` refused as ``--seq/--batch``)."""
    import planner.cli.recost as recost

    monkeypatch.setattr(recost, "flag_message", lambda message: "--seq/--batch: " + message)
    argv = ["plan", "--model", TINY, "--mesh", "2", "--batch", "4", "--dtype", "fp32"]
    argv += ["--fp32-grads"]
    code, err, _, _ = _run(argv, tmp_path)
    inv.refusal_is_one_line(code, err)
    with pytest.raises(AssertionError, match="names --seq, not given"):
        inv.refusal_names_given_input(code, err, " ".join(argv))


def test_an_export_that_changes_the_plan_is_caught(tmp_path, monkeypatch):
    """Mutant: the Megatron-LM line written with half the plan's micro-batch size, and the
    export's own check (the line costed as given) switched off."""
    import planner.launch.megatron as megatron
    import planner.launch.targets as launch

    real = megatron._parallel_args

    def halved(run):
        args = real(run)
        at = args.index("--micro-batch-size") + 1
        args[at] = str(int(args[at]) // 2)
        return args

    argv = ["plan", "--model", TINY, "--mesh", "4", "--batch", "16", "--for", "megatron"]
    code, _, _, out = _run(argv + ["--pp", "1"], tmp_path)
    assert code == 0
    assert json.loads(out.read_text())["layout"]["micro_batch_per_replica"] > 1
    inv.launch_round_trips(out, tmp_path)  # the real export passes
    monkeypatch.setattr(megatron, "_parallel_args", halved)
    with pytest.raises(AssertionError, match="refused an export"):
        inv.launch_round_trips(out, tmp_path)  # the export's check alone catches it
    monkeypatch.setattr(launch, "_checked", lambda target, export: export)
    with pytest.raises(AssertionError, match="iteration_time_s|max_memory_bytes|refused"):
        inv.launch_round_trips(out, tmp_path)
