"""The deploy-side runtime of Flex-DSA bundles: numpy plus whichever runtime is present.

Opens a bundle (folder or zip) and checks its manifest and checksums; ``run(inputs)`` picks the bucket by the
manifest's policy, pads the bucketed axes (masks padded with "ignore"), runs the bucket's artifact with the best
runtime available and crops the outputs back; counts the shapes it served (``traffic``) for the service to
re-specialise the buckets from; ``update()`` switches to a new bundle version atomically. ``python -m
flexdsa_runtime verify BUNDLE`` (``verify``) checks a bundle where it is deployed: each artifact through its runtime,
held against what its report claims. It imports nothing of the compiler or the service
(``tests/runtime/test_runtime_imports.py`` holds it to that).
"""

from flexdsa_runtime.backends import BACKENDS
from flexdsa_runtime.bundle import Bundle, UnpackLimits, open_bundle
from flexdsa_runtime.errors import BackendUnavailable, BundleError, RuntimeRefusal, ShapeRefused
from flexdsa_runtime.runtime import Runtime
from flexdsa_runtime.traffic import Traffic
from flexdsa_runtime.versions import VersionStore

__all__ = [
    "BACKENDS",
    "BackendUnavailable",
    "Bundle",
    "BundleError",
    "Runtime",
    "RuntimeRefusal",
    "ShapeRefused",
    "Traffic",
    "UnpackLimits",
    "VersionStore",
    "open_bundle",
]
