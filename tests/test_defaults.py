"""A default and its help have one source: the dataclass field (SearchOptions, TrainingSettings).

The command line's defaults, the "(default ...)" of its help and the Python functions' defaults
are all read from the dataclasses, so changing a default in one place changes it everywhere.
"""

import argparse
import inspect

import pytest

import planner
from planner.cli.parser import SETTINGS_DEFAULTS, build_parser
from planner.cost.settings import TrainingSettings
from planner.search.options import SEARCH_DEFAULTS, SearchOptions, flag_fields


def _actions(command: str) -> dict[str, argparse.Action]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {s: a for a in sub.choices[command]._actions for s in a.option_strings}


@pytest.mark.parametrize("command", ["plan", "pipeline", "compare"])
def test_search_options_take_default_and_help_from_search_options(command):
    actions = _actions(command)
    offered = [f for f in flag_fields() if f.metadata["flag"] in actions]
    assert len(offered) >= 2
    for f in offered:
        action = actions[f.metadata["flag"]]
        assert action.default == getattr(SEARCH_DEFAULTS, f.name), f.name
        assert action.help.startswith(f.metadata["help"]), action.help
        assert f"(default {getattr(SEARCH_DEFAULTS, f.name):g}" in action.help, action.help


def test_python_functions_default_to_search_options():
    for func in (planner.plan, planner.compare, planner.plan_pipeline, planner.plan_problem):
        parameters = inspect.signature(func).parameters
        for name in ("time_limit_s", "seed", "jobs"):
            if name in parameters:
                assert parameters[name].default == getattr(SEARCH_DEFAULTS, name), (func, name)


def test_search_options_are_frozen():
    options = SearchOptions(time_limit_s=5.0)
    with pytest.raises(AttributeError):
        options.seed = 3
    assert options != SEARCH_DEFAULTS and options.jobs == SEARCH_DEFAULTS.jobs


def test_settings_defaults_and_help_come_from_training_settings():
    settings = TrainingSettings()
    assert SETTINGS_DEFAULTS["bucket_mb"] * 2**20 == settings.bucket_bytes
    for name, value in SETTINGS_DEFAULTS.items():
        if name != "bucket_mb":
            assert value == getattr(settings, name), name
    actions = _actions("plan")
    for flag, name in [
        ("--dtype", "dtype"),
        ("--optimizer", "optimizer"),
        ("--zero", "zero"),
        ("--recompute", "recompute"),
        ("--overlap", "overlap"),
    ]:
        assert f"default {getattr(settings, name)}" in actions[flag].help, flag
    assert f"default {settings.bucket_bytes / 2**20:g}" in actions["--bucket-mb"].help


@pytest.mark.parametrize("command", ["plan", "compare", "pipeline", "evaluate"])
def test_settings_options_are_generated_from_the_fields(command):
    """Every TrainingSettings field with an option is offered with the field's help and choices,
    and every settings option of the command comes from a field (none is written by hand)."""
    from planner.cost.settings import option_default, option_fields

    actions = _actions(command)
    for f in option_fields():
        action = actions[f.metadata["flag"]]
        assert action.help.startswith(f.metadata["help"]), f.name
        assert action.default is None  # None: the field's default, or a plan file's own value
        if f.metadata["choices"]:
            assert list(action.choices) == list(f.metadata["choices"])
            assert str(option_default(f)) in action.choices
    # a new field with a flag appears on the command line without touching the parser
    assert {f.metadata["flag"] for f in option_fields()} >= {"--dtype", "--zero", "--bucket-mb"}
