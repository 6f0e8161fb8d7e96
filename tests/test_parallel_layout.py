"""A 3D plan carries its configuration as one value (``ParallelLayout``): derived once where the
plan is built, written to its JSON, and read by the exporters instead of re-deriving the degrees
from the operators' strategies."""

import copy
import math

import pytest

from planner import api3d
from planner.cost.settings import TrainingSettings
from planner.errors import SettingsError
from planner.launch import launch_run
from planner.pipeline.layout import DATA, NONE, TENSOR, axis_levels, axis_roles, make_layout
from planner.pipeline.schedule import PipelinePlan

SP = TrainingSettings(sequence_parallel=True, zero=1, recompute="selective")


def _pipe(stages: int, micro_batch: int, schedule: str = "1f1b") -> PipelinePlan:
    cuts = tuple(range(1, stages))
    return PipelinePlan(
        "even", schedule, stages, cuts, 8, micro_batch, 1.0, 0.1, 1.0, True, 1, 0, "GIVEN"
    )


def test_roles_levels_and_degrees_by_hand():
    # node=2, gpu=2, tp=2 (tp factored from the node's GPUs): linears split the batch on node and
    # gpu and heads ("a") or ffn ("f") on tp; one linear is replicated on gpu
    axes = (("node", 2), ("gpu", 2), ("tp", 2))
    linears = [("b", "b", "a"), ("b", "b", "f"), ("b", None, "a")]
    assert axis_roles([n for n, _ in axes], linears) == [DATA, NONE, TENSOR]
    assert axis_levels(["node", "gpu", "tp"], ["node", "gpu"]) == ["node", "gpu", "gpu"]
    layout = make_layout(_pipe(4, 16, "interleaved:2"), axes, ("node", "gpu"), linears, SP)
    assert (layout.tensor_parallel_degree, layout.data_parallel_degree) == (2, 4)
    assert layout.world == 4 * 2 * 2 * 2
    # the micro-batch is split over the data axes only (node: 16 / 2), not the replicated one
    assert layout.micro_batch_per_replica == 8
    assert (layout.virtual_stages, layout.cuts, layout.zero) == (2, (1, 2, 3), 1)
    assert [a.level for a in layout.tensor_axes] == ["gpu"]


def test_a_micro_batch_the_data_axes_do_not_divide_has_no_per_replica_size():
    layout = make_layout(_pipe(1, 3), (("gpu", 2),), ("gpu",), [("b",)], SP)
    assert layout.micro_batch_per_replica is None


@pytest.mark.parametrize("tp,pp,dp", [(2, 2, 2), (4, 1, 2), (1, 2, 4)])
def test_the_plan_carries_its_layout_and_the_export_reads_it(tp, pp, dp):
    plan = api3d.evaluate_3d(
        "llama3-8b", "h100-80g", tp=tp, pp=pp, dp=dp, micro_batch=1, batch=16, seq=512,
        settings=TrainingSettings(sequence_parallel=tp > 1), fit_required=False,
    )  # fmt: skip
    layout = plan.layout
    assert layout.world == math.prod(int(p.split("=")[1]) for p in plan.mesh.split(","))
    assert (layout.tensor_parallel_degree, layout.pipeline_degree) == (tp, pp)
    assert layout.data_parallel_degree == dp and layout.micro_batch_per_replica == 1
    data = plan.to_dict(timings=False)
    assert data["layout"] == layout.to_dict()
    data["source"] = {"model": "llama3-8b", "seq": 512, "device": "h100-80g"}
    run = launch_run(data)
    assert (run.tensor_parallel, run.pipeline_parallel, run.data_parallel) == (tp, pp, dp)
    # a file written before plans carried a layout reads to the same degrees (same rule)
    legacy = copy.deepcopy(data)
    del legacy["layout"]
    again = launch_run(legacy)
    assert (again.tensor_parallel, again.data_parallel) == (tp, dp)


def test_the_export_follows_the_layout_not_the_operators():
    plan = api3d.evaluate_3d(
        "llama3-8b", "h100-80g", tp=2, pp=1, dp=4, micro_batch=1, batch=16, seq=512,
        settings=TrainingSettings(sequence_parallel=True), fit_required=False,
    )  # fmt: skip
    data = plan.to_dict(timings=False)
    data["source"] = {"model": "llama3-8b", "seq": 512, "device": "h100-80g"}
    assert launch_run(data).data_parallel == 4
    for axis in data["layout"]["mesh_axes"]:  # mark every axis data parallel
        axis["role"] = DATA
    # the operators still split heads on tp=2; the layout's 8 replicas do not divide the 4 sequences
    with pytest.raises(SettingsError, match="data-parallel degree 8"):
        launch_run(data)


@pytest.mark.parametrize(
    "bad",
    [
        [],
        "x",
        [{"name": "gpu", "size": 0, "role": DATA}],
        [{"name": "gpu", "size": 8}],
        [{"name": "gpu", "size": 8, "role": "pipeline"}],
        [{"name": "gpu", "size": True, "role": DATA}],
    ],
)
def test_a_malformed_layout_is_refused_by_field(bad):
    plan = api3d.evaluate_3d(
        "llama3-8b", "h100-80g", tp=1, pp=1, dp=8, micro_batch=1, batch=16, seq=512,
        fit_required=False,
    )  # fmt: skip
    data = plan.to_dict(timings=False)
    data["source"] = {"model": "llama3-8b", "seq": 512, "device": "h100-80g"}
    data["layout"]["mesh_axes"] = bad
    with pytest.raises(SettingsError, match="layout.mesh_axes"):
        launch_run(data)
