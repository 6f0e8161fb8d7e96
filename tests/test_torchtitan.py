"""torchtitan configurations: a 3D plan of a LLaMA 3 model as a torchtitan 0.3 config_registry file
whose configuration, costed as given, is the plan's iteration time; read back by torchtitan's own
config manager (when torchtitan is installed: `.ci/run` installs it) to the same time; what
torchtitan cannot run as the plan costs it is refused."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.util import find_spec

import pytest

from planner import api3d
from planner.cost.settings import TrainingSettings
from planner.launch.torchtitan import model_parts
from planner.errors import SettingsError
from planner.launch import export_torchtitan, launch_run

FSDP = TrainingSettings(zero=3, fp32_grads=True, loss_kernel="loss-parallel")
# FSDP2 under torch's pipeline stages: gathered weights and whole fp32 gradients to the last
# backward, the memory and collectives of ZeRO-1 (launch.torchtitan_read._zero)
PIPELINED_FSDP = TrainingSettings(zero=1, fp32_grads=True, loss_kernel="loss-parallel")
# Llama 3 8B on 64 H100s: (degrees and schedule, settings)
CASES = (
    (dict(tp=8, pp=2, dp=4, micro_batch=1), PIPELINED_FSDP),
    (
        dict(tp=8, pp=2, dp=4, micro_batch=1, cuts=(10,)),
        TrainingSettings(zero=1, fp32_grads=True, loss_kernel="loss-parallel", recompute="full"),
    ),
    (
        dict(tp=4, pp=4, dp=4, micro_batch=2, schedule="interleaved:2"),
        TrainingSettings(
            zero=1, fp32_grads=True, loss_kernel="loss-parallel", sequence_parallel=True
        ),
    ),
    (dict(tp=8, pp=2, dp=4, micro_batch=1, schedule="gpipe"), PIPELINED_FSDP),
    (
        dict(tp=2, pp=1, dp=32, micro_batch=1),
        TrainingSettings(zero=2, fp32_grads=True, loss_kernel="loss-parallel"),
    ),
    (dict(tp=8, pp=1, dp=8, micro_batch=1), FSDP),
    (
        dict(tp=1, pp=1, dp=64, micro_batch=2),
        TrainingSettings(
            zero=3, fp32_grads=True, loss_kernel="loss-parallel", recompute="selective-op"
        ),
    ),
    (
        dict(tp=1, pp=1, dp=64, micro_batch=1),
        TrainingSettings(fp32_grads=True, loss_kernel="loss-parallel"),
    ),
)
needs_torchtitan = pytest.mark.skipif(
    find_spec("torchtitan") is None, reason="torchtitan not installed"
)


def _plan_file(model: str = "llama3-8b", settings=FSDP, **kw) -> dict:
    plan = api3d.evaluate_3d(
        model, "h100-80g", batch=256, settings=settings, fit_required=False, **kw
    )
    data = plan.to_dict(timings=False)
    data["source"] = {"model": model, "batch": 256, "seq": None, "device": "h100-80g"}
    return data


@pytest.mark.parametrize("case", range(len(CASES)))
def test_the_config_costs_what_the_plan_costs(case):
    degrees, settings = CASES[case]
    export = export_torchtitan(_plan_file(settings=settings, **degrees))
    assert export.gap == pytest.approx(0, abs=1e-9)
    assert "config_registry.llama3_8b()" in export.text
    compile(export.text, "planner_tt.py", "exec")  # a Python file


def test_the_stages_are_module_lists_as_torchtitan_names_them():
    run = launch_run(_plan_file(tp=8, pp=2, dp=4, micro_batch=1, cuts=(10,)))
    parts = model_parts(run)
    assert parts[0][:2] == ["tok_embeddings", "layers.0"] and parts[0][-1] == "layers.9"
    assert parts[1][0] == "layers.10" and parts[1][-2:] == ["norm", "lm_head"]
    interleaved = launch_run(_plan_file(tp=4, pp=4, dp=4, micro_batch=2, schedule="interleaved:2"))
    assert len(model_parts(interleaved)) == 8  # p x v parts of 4 layers


def test_what_torchtitan_cannot_run_is_refused():
    refusals = (
        (
            dict(
                pp=1,
                dp=4,
                settings=TrainingSettings(zero=1, fp32_grads=True, loss_kernel="loss-parallel"),
            ),
            "no ZeRO-1",
        ),
        (dict(settings=FSDP), "ZeRO-3 beside pipeline parallelism is not what torch runs"),
        (
            dict(settings=TrainingSettings(zero=2, fp32_grads=True, loss_kernel="loss-parallel")),
            "whole fp32 gradients until the last micro-batch",
        ),
        (
            dict(
                settings=TrainingSettings(
                    zero=3, fp32_grads=True, loss_kernel="loss-parallel", recompute="selective"
                )
            ),
            "selective",
        ),
        (
            dict(settings=TrainingSettings(fp32_grads=True, loss_kernel="loss-parallel")),
            "FSDP only",
        ),
        (dict(settings=TrainingSettings(zero=3)), "fp32 gradient"),
        (dict(settings=TrainingSettings(zero=1, fp32_grads=True)), "--loss-kernel loss-parallel"),
        (
            dict(
                model="llama:layers=4,hidden=512,heads=8,kv_heads=2,ffn=1024,seq=256,vocab=1024",
                settings=PIPELINED_FSDP,
            ),
            "flavors",
        ),
    )
    for extra, message in refusals:
        kw = dict(tp=2, pp=2, dp=2, micro_batch=1) | extra
        with pytest.raises(SettingsError, match=message):
            export_torchtitan(_plan_file(**kw))


READ_BACK = """
import json, sys
from torchtitan.distributed.parallel_dims import ParallelDims
from planner.launch.torchtitan_read import load_config
from planner.launch import evaluate_torchtitan
out = []
for path in sys.argv[1:]:
    plan, run = evaluate_torchtitan(path, device="h100-80g")  # llama3-70b: its own batch
    world = run.tensor_parallel * run.pipeline_parallel * run.data_parallel
    dims = ParallelDims.from_config(load_config(path, "planner_plan").parallelism, world)
    degrees = [run.tensor_parallel, run.pipeline_parallel, run.data_parallel]
    out.append([plan.pipeline.iteration_time_s, *degrees, run.schedule, run.settings.zero,
                dims.dp_shard * dims.dp_replicate])
print(json.dumps(out))
"""


def _read_back(files: list) -> list:
    """Each config file read by torchtitan's ConfigManager and costed (``READ_BACK``), in a
    process of its own: [iteration s, tp, pp, dp, schedule, ZeRO stage, torchtitan's dp]."""
    done = subprocess.run(
        [sys.executable, "-c", READ_BACK, *map(str, files)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.splitlines()[-1])


@needs_torchtitan
def test_torchtitan_reads_the_configs_back_to_the_same_time(tmp_path):
    """In a process of its own: importing torchtitan changes torch's global state."""
    files, expected = [], []
    for case, (degrees, settings) in enumerate(CASES):
        data = _plan_file(settings=settings, **degrees)
        files.append(tmp_path / f"planner_tt_{case}.py")
        files[-1].write_text(export_torchtitan(data).text)
        expected.append((data["iteration_time_s"], degrees, settings))
    # Llama 3 70B on 512 H100s, planned by the 3D search (FSDP, Megatron's stage plan)
    big = api3d.plan_pipeline(
        "llama3-70b",
        "node=64,gpu=8",
        "h100-80g",
        batch=512,
        intra="megatron",
        degrees=[8],
        counts=[64],
        settings=PIPELINED_FSDP,
    )
    data = big.to_dict(timings=False)
    data["source"] = {"model": "llama3-70b", "batch": 512, "seq": None, "device": "h100-80g"}
    files.append(tmp_path / "planner_tt_70b.py")
    files[-1].write_text(export_torchtitan(data).text)
    expected.append((data["iteration_time_s"], dict(tp=8, pp=8, dp=8), PIPELINED_FSDP))
    for row, (time_s, degrees, settings) in zip(_read_back(files), expected):
        assert row[0] == pytest.approx(time_s, rel=1e-3)
        assert row[1:4] == [degrees["tp"], degrees["pp"], degrees["dp"]]
        assert row[4] == degrees.get("schedule", "1f1b") and row[5] == settings.zero
        assert row[6] == degrees["dp"]  # torchtitan's own degree check for the world size


@pytest.mark.slow  # three planner processes, one importing torchtitan: 16 s
@needs_torchtitan
def test_the_cli_writes_and_reads_a_torchtitan_config(tmp_path):
    plan, config = tmp_path / "p.json", tmp_path / "planner_cli_tt.py"
    run = [sys.executable, "-m", "planner"]
    subprocess.run(
        run
        + [
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
            str(plan),
            "-q",
        ],
        check=True,
    )
    subprocess.run(
        run + ["export", "--plan", str(plan), "--target", "torchtitan", "--out", str(config)],
        check=True,
        capture_output=True,
    )
    back = subprocess.run(
        run + ["evaluate", "--from-torchtitan", str(config), "--device", "h100-80g"],
        capture_output=True,
        text=True,
    )
    assert back.returncode == 0, back.stderr[-2000:]
    assert "pp=2,dp=4,tp=8" in back.stdout
    missing = subprocess.run(
        run + ["evaluate", "--from-torchtitan", str(config), "--config", "nothing"],
        capture_output=True,
        text=True,
    )
    assert missing.returncode == 2 and "nothing" in missing.stderr


READ_AS_WRITTEN = """
import contextlib, io, json, sys
from planner.cli.main import main
out = []
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()) as said:
        code = main(argv)
    out.append([code, said.getvalue()[:400], err.getvalue()[-400:]])
print(json.dumps(out))
"""


def _read_as_written(calls: list[list[str]]) -> list:
    """(exit code, stdout head, stderr tail) of each CLI call, in a process of its own (importing
    torchtitan changes torch's global state)."""
    done = subprocess.run(
        [sys.executable, "-c", READ_AS_WRITTEN, json.dumps(calls)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.splitlines()[-1])


@needs_torchtitan
def test_configs_are_read_by_module_name_and_as_the_users_own_files(tmp_path):
    """torchtitan's own registry by module name (--module llama3 --config llama3_70b); a file
    named llama3.py is the user's file, not torchtitan's registry of that name; a file named
    json.py shadows nothing; a file that raises or calls sys.exit is refused in one line."""
    config = export_torchtitan(_plan_file(tp=2, pp=1, dp=4, micro_batch=1)).text
    (tmp_path / "llama3.py").write_text(config)
    (tmp_path / "json.py").write_text(config)
    (tmp_path / "raises.py").write_text("raise RuntimeError('no GPUs here')\n")
    (tmp_path / "exits.py").write_text("import sys\nsys.exit(0)\n")
    base = ["evaluate", "--device", "h100-80g", "--from-torchtitan"]
    calls = [
        base + ["llama3", "--config", "llama3_70b", "--dp", "8"],
        base + [str(tmp_path / "llama3.py")],
        base + [str(tmp_path / "json.py")],
        base + [str(tmp_path / "raises.py")],
        base + [str(tmp_path / "exits.py")],
    ]
    stock, own, shadow, raises, exits = _read_as_written(calls)
    assert stock[0] == 0 and "layers=80" in stock[1]
    assert own[0] == 0 and "pp=1,dp=4,tp=2" in own[1] and "layers=32" in own[1]
    assert shadow[0] == 0 and "pp=1,dp=4,tp=2" in shadow[1]
    assert raises[0] == 2 and "raises RuntimeError when read: no GPUs here" in raises[2]
    assert exits[0] == 2 and "exits (0) when read" in exits[2]


def test_fsdp_under_pipelining_reads_as_zero_1():
    """torch's pipeline stages keep FSDP2's gathered weights and whole fp32 gradients until the
    last micro-batch's backward (torch/distributed/pipelining/stage.py): ZeRO-1's memory."""
    from planner.launch.torchtitan_read import _zero

    assert [_zero(r, 8, 1) for r in ("default", "always", "never")] == [3, 3, 2]
    assert [_zero(r, 8, 4) for r in ("default", "never")] == [1, 1]
    assert _zero("default", 1, 4) == 0
    with pytest.raises(SettingsError, match="'always' beside pipeline"):
        _zero("always", 8, 4)


def _edited(config: str, *lines: str) -> str:
    """The exported config with ``lines`` run before it is returned."""
    return config.replace(
        "    return config\n", "".join(f"    {line}\n" for line in lines) + "    return config\n"
    )


@needs_torchtitan
def test_torchtitan_defaults_and_unpriced_keys_are_read(tmp_path):
    """Without module lists torchtitan builds the parts itself (two virtual stages a rank under
    Interleaved1F1B; the first and last stages one layer lighter): read as torchtitan builds
    them. Keys that change the step unpriced (torch.compile, CPU offload, another reduce dtype)
    are refused naming the key."""
    config = export_torchtitan(
        _plan_file(tp=8, pp=2, dp=4, micro_batch=1, settings=PIPELINED_FSDP)
    ).text
    files = {
        "interleaved": (
            "p.module_fqns_per_model_part = None",
            'p.pipeline_parallel_schedule = "Interleaved1F1B"',
        ),
        "heavier_ends": (
            "p.module_fqns_per_model_part = None",
            "p.pipeline_parallel_first_stage_less_layers = 4",
        ),
        "compiled": ("config.compile.enable = True",),
        "offload": ("config.training.enable_cpu_offload = True",),
        "bf16_reduce": ('config.training.mixed_precision_reduce = "bfloat16"',),
    }
    calls = []
    for name, lines in files.items():
        (tmp_path / f"{name}.py").write_text(_edited(config, *lines))
        calls.append(
            [
                "evaluate",
                "--device",
                "h100-80g",
                "--from-torchtitan",
                str(tmp_path / f"{name}.py"),
                "--json",
                str(tmp_path / f"{name}.json"),
            ]
        )
    interleaved, heavier, compiled, offload, reduce = _read_as_written(calls)
    assert interleaved[0] == 0 and heavier[0] == 0, (interleaved, heavier)
    pipe = json.loads((tmp_path / "interleaved.json").read_text())["pipeline"]
    assert pipe["schedule"] == "interleaved:2"
    # 32 layers, first stage 4 layers lighter (torchtitan's weights): not the even 16 | 16
    cuts = json.loads((tmp_path / "heavier_ends.json").read_text())["pipeline"]["cuts"]
    assert cuts != [16]
    for code, message in (
        (compiled, "compile.enable"),
        (offload, "enable_cpu_offload"),
        (reduce, "mixed_precision_reduce"),
    ):
        assert code[0] == 2 and message in code[2], code


@needs_torchtitan
def test_the_stock_8b_config_reads_with_its_operator_policy(tmp_path):
    """torchtitan's llama3_8b config checkpoints with SelectiveAC (its operator policy): read as
    recompute selective-op (it was refused before), and an edited policy is refused by name."""
    config = export_torchtitan(_plan_file(tp=1, pp=1, dp=64, micro_batch=1, settings=FSDP)).text
    (tmp_path / "forced.py").write_text(
        _edited(
            config,
            "from torchtitan.distributed.activation_checkpoint import SelectiveAC",
            "config.activation_checkpoint = SelectiveAC.Config("
            'force_recompute_mm_shapes_by_fqns=["w1"])',
        )
    )
    out = tmp_path / "stock.json"
    base = ["evaluate", "--device", "h100-80g", "--from-torchtitan"]
    stock, forced = _read_as_written(
        [
            base + ["llama3", "--config", "llama3_8b", "--dp", "8", "--json", str(out)],
            base + [str(tmp_path / "forced.py")],
        ]
    )
    assert stock[0] == 0, stock
    assert json.loads(out.read_text())["settings"]["recompute"] == "selective-op"
    assert forced[0] == 2 and "SelectiveAC with its default policy" in forced[2], forced


@pytest.mark.slow
@pytest.mark.heavy  # the engine's whole search on 64 and 512 GPUs: about 4 min on 2 cores
@needs_torchtitan
def test_plan_for_torchtitan_reads_back_through_torchtitan(tmp_path):
    """The acceptance models torchtitan trains, planned by `plan --for torchtitan` (unpinned):
    each config file loads through torchtitan's own ConfigManager and costs the plan's time."""
    from planner.launch import plan_data, plan_for

    files, expected = [], []
    for model, mesh, batch in (
        ("llama3-8b", "node=8,gpu=8", 256),
        ("llama3-70b", "node=64,gpu=8", 512),
    ):
        plan = plan_for("torchtitan", model, mesh, "h100-80g", batch=batch)
        files.append(tmp_path / f"planner_for_{len(files)}.py")
        files[-1].write_text(export_torchtitan(plan_data(plan, model, None)).text)
        expected.append(plan.pipeline.iteration_time_s)
    assert [row[0] for row in _read_back(files)] == pytest.approx(expected, rel=1e-3)


def test_a_model_a_quantization_converter_made_is_refused_by_its_path():
    """Was: a config whose model_spec came from ``model_registry(flavor,
    converters=[Float8LinearConverter.Config()])`` was costed as the bf16 step without a word.
    The converter swaps configs inside the model's tree for ones from
    torchtitan.components.quantization; the reader walks the tree (no torchtitan needed here: the
    tree below is built by hand as the converter leaves it)."""
    from dataclasses import dataclass, field

    from planner.launch.torchtitan_read import QUANTIZATION, _refuse_converted

    converted = type("Config", (), {"__module__": f"{QUANTIZATION}.float8"})
    converted.__qualname__ = "Float8Linear.Config"

    @dataclass
    class Block:
        wq: object = None

    @dataclass
    class Model:
        layers: list = field(default_factory=list)

    stock = Model([Block(), Block()])
    _refuse_converted(stock)  # nothing converted: read as before
    with pytest.raises(
        SettingsError, match=r"model_spec\.model\.layers\[1\]\.wq is a Float8Linear"
    ):
        _refuse_converted(Model([Block(), Block(converted())]))
