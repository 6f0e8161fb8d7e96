"""Hardening 3 regressions: options that were accepted and ignored or made an unrunnable plan."""

import subprocess
import sys

import pytest

from planner import api
from planner.errors import PlannerError, SettingsError
from planner.pipeline.schedule import parse_schedule


def _cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "planner", *args], capture_output=True, text=True, cwd=cwd)


@pytest.mark.parametrize("schedule", ["interleaved:", "interleaved:x", "interleaved:1", "1f1b:", "gpipe:2",
                                      "interleaved:٣", "interleaved:99999999"])
def test_malformed_schedules_are_refused(schedule):
    """`interleaved:` (no v) was read as interleaved:2."""
    with pytest.raises(SettingsError, match="--schedule"):
        parse_schedule(schedule)


def test_more_chunks_than_layers_per_stage_is_refused(tmp_path):
    """interleaved:13 on 4 stages of a 24-layer model was returned as OPTIMAL: the bubble term
    (p-1)/(v m) rewards any v, but a stage needs a layer per chunk."""
    run = _cli("plan", "--model", "gpt3-1.3b", "--mesh", "node=4,gpu=2", "--batch", "32", "--pipeline", "auto",
               "--pp", "4", "--num-microbatches", "8", "--schedule", "interleaved:13", "--json", "p.json", cwd=tmp_path)
    assert run.returncode == 2 and not (tmp_path / "p.json").exists()
    assert run.stderr.strip().count("\n") == 0 and "--schedule" in run.stderr and "52 > 24" in run.stderr
    with pytest.raises(SettingsError, match="--schedule"):
        api.evaluate_3d("gpt3-1.3b", tp=2, pp=4, dp=1, micro_batch=4, batch=32, schedule="interleaved:7")
    # a v that fits is planned, and the search only tries degrees with v layers per stage
    found = api.plan_pipeline("gpt3-1.3b", "node=8,gpu=1", batch=32, schedule="interleaved:4", intra="dp",
                              method="even")
    assert found.pipeline.stages * 4 <= 24


@pytest.mark.parametrize("spec,field", [("hf:gpt2:layerz=2", "layerz"), ("hf:llama:layers=2,layers=3", "layers"),
                                        ("hf:resnet50:depth=2", "depth")])
def test_unknown_or_repeated_preset_keys_are_refused(spec, field):
    """`hf:gpt2:layerz=2` imported the full 12-layer GPT-2; a repeated key, the last won."""
    pytest.importorskip("torch")
    from planner.engines.torch_presets import build_spec
    with pytest.raises(PlannerError, match=field):
        build_spec(spec)
