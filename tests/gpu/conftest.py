"""GPU twins of the CPU integration tests: skipped unless CUDA is usable (run them on a GPU machine)."""

import pytest

from verl_like.utils.device import is_cuda_available


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "tests/gpu/" in str(item.fspath):
            item.add_marker(pytest.mark.gpu)
            if not is_cuda_available():
                item.add_marker(skip)
