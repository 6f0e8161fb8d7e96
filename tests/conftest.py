import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
REFERENCE = REPO.parent / "shared" / "reference"


@pytest.fixture(scope="session")
def a100():
    from planner.mesh import get_profile
    return get_profile("a100-80g")


@pytest.fixture(scope="session")
def reference_dir():
    if not REFERENCE.is_dir():
        pytest.skip("shared/reference is not beside the repository")
    return REFERENCE
