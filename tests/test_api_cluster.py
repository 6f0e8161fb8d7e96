"""``plan``, ``evaluate``, ``compare`` and ``plan_pipeline`` take a ``Cluster`` where they take a
mesh spec: the same plan as the spec on the cluster's device, and a device or memory beside it
refused with an error naming the parameter."""

import pytest

import planner


@pytest.fixture(scope="module")
def h100():
    return planner.make_cluster("2x4", "h100-80g")


def test_a_cluster_plans_as_its_spec_and_device(h100):
    given = planner.plan("gpt2-small", h100)
    spelled = planner.plan("gpt2-small", "2x4", "h100-80g")
    assert given.device == "h100-80g" and given.objective == spelled.objective
    assert given.objective != planner.plan("gpt2-small", "2x4").objective  # the device is honoured
    assignment = {op.name: dict(op.strategy) for op in given.operators}
    assert planner.evaluate("gpt2-small", h100, assignment=assignment).objective == given.objective
    rows = planner.compare("gpt2-small", h100, methods=("exact", "dp"))
    assert {row["device"] for row in rows} == {"h100-80g"} and rows[0][
        "objective"
    ] == given.objective


def test_a_cluster_plans_a_pipeline_as_its_spec():
    cluster = planner.make_cluster("node=4,gpu=2", "h100-80g")
    given = planner.plan_pipeline("gpt3-1.3b", cluster, batch=32)
    spelled = planner.plan_pipeline("gpt3-1.3b", "node=4,gpu=2", "h100-80g", batch=32)
    assert given.device == "h100-80g" and given.step_time_s == spelled.step_time_s


@pytest.mark.parametrize(
    "extra,message",
    [
        ({"memory": 1e9}, "memory: the Cluster has its own"),
        ({"device": "a40-48g"}, "device: the Cluster is on h100-80g"),
    ],
)
def test_a_setting_beside_a_cluster_is_refused(h100, extra, message):
    with pytest.raises(planner.SettingsError, match=message):
        planner.plan("gpt2-small", h100, **extra)
