"""Errors raised from Python name the parameter the caller passed; the command line names its flag.

The library's messages are written once, naming the command-line flag (``--mesh: ...``); the
public functions of ``planner`` rewrite the flag to the Python name (``mesh: ...``).
"""

import inspect
import subprocess
import sys

import pytest

import planner
from planner.errors import MeshError, ModelError, ProfileError, SettingsError, python_message

# (public function, keyword arguments, exception type, the name the message must start with)
BAD_CALLS = [
    (planner.evaluate, dict(model="gpt2-small", mesh="no mesh", tp=2, dp=4), SettingsError, "mesh"),
    (planner.plan, dict(model="no-such-model"), ModelError, "model"),
    (planner.plan, dict(model="gpt2-small", batch=0), ModelError, "batch"),
    (planner.plan, dict(model="gpt2-small", mesh="2x"), MeshError, "mesh"),
    (planner.plan, dict(model="gpt2-small", memory=-1), SettingsError, "memory"),
    (planner.plan, dict(model="gpt2-small", method="nope"), SettingsError, "method"),
    (
        planner.plan,
        dict(model="gpt2-small", hardware_csv="/no/such.csv"),
        ProfileError,
        "hardware_csv",
    ),
    (planner.compare, dict(model="gpt2-small", methods=("nope",)), SettingsError, "methods"),
    (planner.load_plan, dict(path="/no/such/plan.json"), SettingsError, "path"),
    (planner.load_model, dict(name="gpt:layers=x"), ModelError, "name"),
    (planner.plan_pipeline, dict(model="gpt2-small", devices=8, cuts=(3,)), SettingsError, "cuts"),
    (planner.make_cluster, dict(mesh="8", memory=0), SettingsError, "memory"),
]


@pytest.mark.parametrize("func, kwargs, error, name", BAD_CALLS)
def test_python_errors_name_the_parameter(func, kwargs, error, name):
    with pytest.raises(error) as caught:
        func(**kwargs)
    message = str(caught.value)
    assert message.startswith(f"{name}:"), message
    assert "--" not in message, message
    assert name in inspect.signature(func).parameters


def test_the_command_line_still_names_its_flags():
    """The same inputs on the command line: the message names the flag, exit 2."""
    for args, flag in [
        (["plan", "--model", "no-such-model"], "--model:"),
        (["plan", "--model", "gpt2-small", "--batch", "0"], "--batch:"),
        (["evaluate", "--plan", "/no/such/plan.json"], "--plan:"),
    ]:
        run = subprocess.run(
            [sys.executable, "-m", "planner", *args], capture_output=True, text=True
        )
        assert run.returncode == 2, run.stderr
        assert flag in run.stderr, run.stderr


def test_settings_flags_read_as_settings_fields():
    """A flag that is a field of TrainingSettings reads settings.<field> from a function that
    takes the settings whole; hints inside the message are renamed too."""
    renamed = python_message(
        "--zero: 3 needs --dtype bf16 (raise --time-limit or --max-memory)",
        ("model", "settings", "time_limit_s"),
        {"zero": "settings.zero", "dtype": "settings.dtype", "time-limit": "time_limit_s"},
    )
    assert renamed == (
        "settings.zero: 3 needs settings.dtype bf16 (raise time_limit_s or max_memory)"
    )
    # Not flags: a negative number, a word joined by dashes, an em-dash-like run of hyphens.
    for text in ("batch: got -1", "a--b stays", "range 1 -- 3"):
        assert python_message(text, ("batch",), {}) == text


def test_every_public_function_names_its_parameters():
    """Each function of the public API goes through the renaming (a new one that does not
    fails here), and the wrapper keeps the signature and docstring the reference documents."""
    for name in planner.__all__:
        func = getattr(planner, name)
        if inspect.isfunction(func):
            assert hasattr(func, "__wrapped__"), name
            assert func.__doc__ == func.__wrapped__.__doc__, name
            assert inspect.signature(func) == inspect.signature(func.__wrapped__), name


def test_the_error_keeps_its_type_and_cause():
    with pytest.raises(ModelError) as caught:
        planner.load_model("gpt:layers=x")
    assert caught.value.args == (str(caught.value),)
    assert isinstance(caught.value, planner.PlannerError)


def test_a_memory_limit_has_one_encoding():
    """A search takes the memory limit as a number of bytes, inf for none: None (the other
    encoding the signatures once took) is refused naming the parameter; a Cluster holds inf."""
    cluster = planner.make_cluster("8", memory=float("inf"))
    assert cluster.memory_limit == float("inf")
    assert planner.make_cluster("8", "symbolic").memory_limit == float("inf")
    problem = planner.make_problem("mlp", cluster)
    with pytest.raises(SettingsError, match="^memory_limit: must be a non-negative number"):
        planner.plan_problem(problem, None)
    free = planner.plan_problem(problem, float("inf"))
    assert free.found and free.memory_limit_bytes is None  # JSON null: no limit
