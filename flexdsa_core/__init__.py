"""Flex-DSA compiler core: ONNX in, a verified, optimised, deployable package for an edge target out.

The one entry point is ``FlexDSAOptimizer(target).optimize(model, options, cache=..., progress=...)``.
This package is a pure library: it never imports the web framework, the task queue, the database or
the cache server, and never reads environment variables (see ``tests/core/test_purity.py``).
"""

from flexdsa_core.errors import FlexDSAError
from flexdsa_core.options import OptimizeOptions, RequestSpec
from flexdsa_core.targets import TargetSpec, list_targets, load_target
from flexdsa_core.version import __version__

__all__ = [
    "FlexDSAError",
    "FlexDSAOptimizer",
    "OptimizeOptions",
    "RequestSpec",
    "TargetSpec",
    "__version__",
    "list_targets",
    "load_target",
]


def __getattr__(name: str):
    # The optimizer pulls in onnxruntime and every rule; import it only when asked for.
    if name == "FlexDSAOptimizer":
        from flexdsa_core.optimizer import FlexDSAOptimizer

        return FlexDSAOptimizer
    raise AttributeError(name)
