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
