"""Qualcomm QNN through ONNX Runtime's QNN execution provider: the Hexagon HTP backend, emulated on x86.

``onnxruntime-qnn`` 2.x is a plugin execution provider for a stock ``onnxruntime`` (>= 1.24.2): the
driver registers its library (``register_execution_provider_library``) and picks the QNN device from
``get_ep_devices()``. It carries the QNN SDK's HTP backend, which on x86 runs the HTP graph in emulation:
the same op validation, quantised numerics and context-binary generation as on the phone. numpy comes
with onnxruntime; it is pinned here only so that ready.json records what the driver ran with. None of
this enters the project's environment (the core never imports onnxruntime-qnn).
"""

from __future__ import annotations

from pathlib import Path

from flexdsa_core.toolchains.base import Toolchain

TOOLCHAIN = Toolchain(
    name="qualcomm",
    description="onnxruntime-qnn: QNN HTP (Hexagon NPU) emulation, placement and EPContext binary, per bucket.",
    targets=("qualcomm-sm8650",),
    requirements=(("onnxruntime>=1.24.2", "onnxruntime-qnn==2.7.0", "onnx>=1.17", "numpy>=1.26"),),
    driver=str(Path(__file__).with_name("driver.py")),
    version_of=("onnxruntime", "onnxruntime-qnn", "onnx", "numpy"),
)
