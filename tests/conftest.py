import os
import tempfile

import pytest

# Kernels the tests compile go to a disk cache of the test run, not the user's (gdngen.runtime.store).
os.environ.setdefault("GDNGEN_CACHE_DIR", tempfile.mkdtemp(prefix="gdngen-test-cache-"))


def _has_gpu() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if _has_gpu():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (sm_90a); runs on the H100/H200 machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
