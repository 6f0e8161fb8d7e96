from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
REFERENCE = REPO / "experiments" / "data"  # published measurements, cited in each file


@pytest.fixture(scope="session")
def a100():
    from planner.cluster.profiles import get_profile

    return get_profile("a100-80g")


@pytest.fixture(scope="session")
def reference_dir():
    return REFERENCE


def pytest_addoption(parser):
    parser.addoption(
        "--fuzz-scale",
        type=int,
        default=1,
        help="multiply the generated cases of the fuzz tests (default 1; CI: 2 and 10)",
    )
