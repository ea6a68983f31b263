import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
sys.path.insert(0, str(ROOT))
torch.set_num_threads(1)  # the tests use tiny tensors: one thread is faster than two that wait on each other


@pytest.fixture
def shared_dir():
    """The read-only ../shared folder beside the checkout; tests using it skip without it."""
    if not SHARED.is_dir():
        pytest.skip("../shared is not available")
    return SHARED
