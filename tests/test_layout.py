"""The package's shape: layered imports, size limits, a light ``import planner``, and every name and
path the README and CONTRIBUTING.md mention exists."""

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "planner"
# Each layer may import only from itself and the layers before it (README, Architecture).
LAYERS = (
    ("planner.errors", "planner.signals", "planner.outputs", "planner.jsonfile", "planner.units"),
    ("planner.ir",),
    ("planner.zoo",),
    ("planner.cluster",),
    ("planner.cost",),
    ("planner.search",),
    ("planner.plans", "planner.plan_files", "planner.grid", "planner.methods"),
    ("planner.pipeline",),
    ("planner.engines",),
    (
        "planner.api",
        "planner.api3d",
        "planner.runs",
        "planner.launch",
        "planner.front",
        "planner.accumulation",
        "planner.grid3d",
    ),
    ("planner.launch.gap",),
    ("planner.show",),
    ("planner.cli", "planner.__main__"),
)
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 50


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _layer(module: str) -> int:
    for index, prefixes in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return index
    raise AssertionError(f"{module} is in no layer of the README's architecture")


def _imports(path: Path) -> set[str]:
    """Every planner module a file imports, at the top or inside a function."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("planner"):
            out.update(
                f"{node.module}.{a.name}" if node.module == "planner" else node.module
                for a in node.names
            )
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("planner"))
    return out


def test_imports_flow_one_way():
    modules = _modules()
    wrong = []
    for name, path in modules.items():
        if name == "planner":
            continue
        for target in _imports(path):
            target = target if target in modules else target.rsplit(".", 1)[0]
            if _layer(target) > _layer(name):
                wrong.append(f"{name} imports {target}")
    assert not wrong, wrong


def _edges(path: Path, modules: dict[str, Path]) -> list[tuple[str, tuple[str, ...], int]]:
    """(module imported, names taken from it, line) for every planner import of a file,
    function-local ones included; ``from package import module`` is an import of that module."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (
            isinstance(node, ast.ImportFrom)
            and node.module
            and node.module.split(".")[0] == "planner"
        ):
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                out.append(
                    (sub, (), node.lineno)
                    if sub in modules
                    else (node.module, (alias.name,), node.lineno)
                )
        elif isinstance(node, ast.Import):
            out += [
                (a.name, (), node.lineno) for a in node.names if a.name.split(".")[0] == "planner"
            ]
    return out


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {
        name: {
            target for target, _, _ in _edges(path, modules) if target in modules and target != name
        }
        for name, path in modules.items()
    }


def _engine(module: str) -> str | None:
    for engine in ("torch", "jax"):
        if module == f"planner.engines.{engine}" or module.startswith(f"planner.engines.{engine}."):
            return engine
    return "neutral" if module.startswith("planner.engines") else None


def test_no_import_cycle_anywhere():
    """Function-local imports included: a cycle hidden in a function is still a cycle."""
    import networkx as nx

    graph = nx.DiGraph(
        [(a, b) for a, targets in _graph().items() for b in targets if a != "planner"]
    )
    cycles = [sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1]
    assert not cycles, cycles


def test_engines_keep_to_their_rooms():
    """The JAX engine never imports the PyTorch engine nor the reverse, and the neutral engine
    modules import neither engine (nor torch or JAX at module level)."""
    wrong = []
    modules = _modules()
    for name, targets in _graph().items():
        mine = _engine(name)
        for target in targets:
            theirs = _engine(target)
            if (
                mine in ("torch", "jax", "neutral")
                and theirs in ("torch", "jax")
                and theirs != mine
            ):
                wrong.append(f"{name} ({mine}) imports {target} ({theirs})")
        if mine == "neutral":
            for node in ast.parse(modules[name].read_text()).body:
                names = (
                    [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else [node.module or ""]
                    if isinstance(node, ast.ImportFrom)
                    else []
                )
                wrong += [
                    f"{name} imports {n} at module level"
                    for n in names
                    if n.split(".")[0] in ("torch", "jax")
                ]
    assert not wrong, wrong


def test_no_module_takes_another_modules_private_names():
    modules = _modules()
    taken = [
        f"{name}:{line} takes {target}.{n}"
        for name, path in modules.items()
        for target, names, line in _edges(path, modules)
        for n in names
        if n.startswith("_") and target != name
    ]
    assert not taken, taken


def test_sizes():
    too_long = []
    for name, path in _modules().items():
        text = path.read_text()
        if len(text.splitlines()) > MAX_MODULE_LINES:
            too_long.append(f"{name}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    too_long.append(f"{name}.{node.name}: {length} lines")
    assert not too_long, too_long


def test_no_function_over_the_cap_in_tests_experiments_and_benchmarks():
    """The function cap holds outside the package too (test modules may be longer: one module per
    concept under test)."""
    too_long = []
    for folder in ("tests", "experiments", "benchmarks"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    length = node.end_lineno - node.lineno + 1
                    if length > MAX_FUNCTION_LINES:
                        too_long.append(f"{path.relative_to(ROOT)}:{node.name}: {length} lines")
    assert not too_long, too_long


def test_the_code_is_formatted_and_lint_free():
    """``ruff format`` (100 columns) leaves every file as it is and ``ruff check`` passes
    (pyflakes, pycodestyle's errors, lines past 100 columns): the size limits above are measured on
    formatted code."""
    pytest.importorskip("ruff")
    for command in (["format", "--check", "--quiet"], ["check", "--quiet"]):
        done = subprocess.run(
            [sys.executable, "-m", "ruff", *command, str(ROOT)],
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
        assert done.returncode == 0, f"ruff {' '.join(command)}:\n{done.stdout}{done.stderr}"


def test_every_subpackage_says_what_it_owns():
    for init in sorted(PACKAGE.glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc and len(doc) > 60, (
            f"{init.relative_to(ROOT)} has no docstring saying what it owns"
        )


def test_import_planner_loads_neither_torch_nor_jax():
    code = (
        "import sys, planner; print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', "
        "'jax')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True
    )
    assert out.stdout.strip() == "[]"


def _documents() -> str:
    pages = sorted((ROOT / "docs").glob("*.md"))
    return "".join(p.read_text() for p in [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *pages])


def test_every_name_the_readme_uses_exists():
    text = _documents()
    names = set()
    for block in re.findall(r"from planner import ([^\n]+)", text):
        names.update(n.strip() for n in block.split(","))
    names.update(re.findall(r"`planner\.([A-Za-z_][\w.]*)`", text))
    assert {
        "plan",
        "TrainingSettings",
        "plan_pipeline",
    } <= names  # the parse found the README's names
    for name in sorted(names):
        module, _, attr = ("planner." + name).rpartition(".")
        try:
            target = importlib.import_module("planner." + name)
        except ModuleNotFoundError:
            target = getattr(importlib.import_module(module), attr, None)
        assert target is not None, f"README names planner.{name}, which does not exist"


def test_every_path_the_readme_names_exists():
    paths = set(
        re.findall(r"`((?:planner|tests|experiments|benchmarks|results)/[\w./]*)`", _documents())
    )
    assert len(paths) > 20
    missing = sorted(p for p in paths if not (ROOT / p).exists())
    assert not missing, missing


@pytest.mark.parametrize(
    "name",
    [
        "plan",
        "evaluate",
        "compare",
        "plan_pipeline",
        "evaluate_3d",
        "TrainingSettings",
        "load_model",
        "make_cluster",
        "make_problem",
        "Plan",
        "Plan3D",
        "GraphBuilder",
    ],
)
def test_public_api_is_stable(name):
    import planner

    assert name in planner.__all__ and getattr(planner, name) is not None


def test_public_api_is_small_and_documented():
    """At most 25 names; the API page documents each one's module (experiment helpers are not
    exported: they are imported from their own modules)."""
    import planner

    assert len(planner.__all__) <= 25 and len(set(planner.__all__)) == len(planner.__all__)
    assert all(getattr(planner, name) is not None for name in planner.__all__)
    assert "plan_for_verification" not in planner.__all__ and "sapp_levels" not in planner.__all__
    page = (ROOT / "docs" / "api.md").read_text()
    assert all(f"`{name}`" in page for name in planner.__all__), [
        name for name in planner.__all__ if f"`{name}`" not in page
    ]


POSITIONAL_CAP = 6  # parameters a public call may take by position; the rest are keyword-only


def _public_callables():
    """(name, callable) of every public function and every public method of a public class."""
    import inspect

    import planner

    for name in planner.__all__:
        obj = getattr(planner, name)
        if inspect.isfunction(obj):
            yield name, obj
        elif inspect.isclass(obj):
            for attr, member in vars(obj).items():
                if not attr.startswith("_") and inspect.isfunction(member):
                    yield f"{name}.{attr}", member
                elif not attr.startswith("_") and isinstance(member, (classmethod, staticmethod)):
                    yield f"{name}.{attr}", member.__func__


def test_public_signatures_take_at_most_six_parameters_by_position():
    """Every public function and method: at most ``POSITIONAL_CAP`` positional-or-keyword
    parameters (self and cls aside); the others are keyword-only, so a call reads by name."""
    import inspect

    checked, over = 0, []
    for name, func in _public_callables():
        kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        params = inspect.signature(func).parameters.values()
        positional = [p for p in params if p.kind in kinds and p.name not in ("self", "cls")]
        checked += 1
        if len(positional) > POSITIONAL_CAP:
            over.append((name, len(positional)))
    assert checked > 25 and not over, over


def test_the_written_layer_order_is_the_checked_one():
    """CONTRIBUTING.md's one-line layer order names the layers of ``LAYERS``, in their order."""
    text = (ROOT / "CONTRIBUTING.md").read_text()
    names = re.search(r"\(`(ir(?: -> \w+)+)`\)", text).group(1).split(" -> ")
    ranks = [_layer(f"planner.{name}") for name in names]
    assert len(names) >= 8 and ranks == sorted(set(ranks))


# The function-local imports of planner modules: each target imports torch at its top, which
# `import planner` and the command line's start-up must not.
LOCAL_IMPORTS = {
    ("planner/engines/torch/pipeline.py", "planner.engines.torch.edges"),
    ("planner/engines/torch/reference.py", "planner.engines.torch.xp"),
    ("planner/engines/torch/worker.py", "planner.engines.torch.edges"),
    ("planner/engines/torch/worker.py", "planner.engines.torch.xp"),
}


def _local_imports() -> set[tuple[str, str]]:
    modules, found = _modules(), set()
    for path in modules.values():
        for function in ast.walk(ast.parse(path.read_text())):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(function):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("planner"):
                    for alias in node.names:
                        sub = f"{node.module}.{alias.name}"
                        found.add(
                            (str(path.relative_to(ROOT)), sub if sub in modules else node.module)
                        )
                elif isinstance(node, ast.Import):
                    found |= {
                        (str(path.relative_to(ROOT)), a.name)
                        for a in node.names
                        if a.name.startswith("planner")
                    }
    return found


def test_imports_are_at_the_top_but_those_that_pull_torch_in():
    """Imports of planner modules sit at the top of their module (the dependency picture is the
    file's head), except the listed ones, each of whose targets loads torch when imported."""
    assert _local_imports() == LOCAL_IMPORTS
    for target in sorted({target for _, target in LOCAL_IMPORTS}):
        code = f"import sys, {target}; print('torch' in sys.modules)"
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
        assert out.stdout.strip() == "True", target
