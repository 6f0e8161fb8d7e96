"""3D plans: pipeline degree, intra-operator plans on stage sub-meshes, memory."""

import subprocess
import sys

import pandas as pd

from planner.api import plan_pipeline


def test_gpt3_175b_on_1024_gpus_pipelines_and_keeps_tensor_parallel_in_node():
    result = plan_pipeline("gpt3-175b", "node=128,gpu=8", "a100-80g", batch=1536)
    pipe = result.pipeline
    assert pipe.stages > 1 and pipe.fits_memory and pipe.max_memory_bytes <= 80e9
    assert dict(result.tensor_parallel_dims)["gpu"] in ("a", "f")  # heads / ffn split inside the node
    assert dict(result.tensor_parallel_dims)["node"] not in ("a", "f")
    assert not any(c["stages"] == 1 and c["fits_memory"] for c in result.candidates)


def test_pipeline_command_writes_csv(tmp_path):
    out = tmp_path / "pipe.csv"
    proc = subprocess.run([sys.executable, "-m", "planner", "pipeline", "--model", "gpt:layers=8,hidden=512,heads=8",
                           "--devices", "32", "--batch", "32", "--pipeline-method", "exact", "--csv", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    row = pd.read_csv(out)
    assert row["method"][0] == "exact" and row["intra_method"][0] == "exact" and row["fits_memory"][0]
    assert "pipeline stages" in proc.stdout
