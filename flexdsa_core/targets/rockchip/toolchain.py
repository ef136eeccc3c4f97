"""Rockchip RKNN-Toolkit2: compiles ONNX for the RK3588 NPU and runs the result in its x86 simulator.

rknn-toolkit2 2.5.0 asks for ``torch<=2.4.0``, which on the package registry is a CUDA build that pulls
gigabytes of NVIDIA libraries; torch is only used by its PyTorch front end, never on the ONNX path we
take. So the CPU build of torch goes in first, then the toolkit's other requirements (its own bounds:
numpy<=1.26.4, onnx<=1.18, protobuf<=4.25.4), then the toolkit itself without dependency resolution.
The driver reads the verbose build's "Network Layer Information Table" for where each ONNX node ran
and the toolkit's own cycle estimate per layer.
"""

from __future__ import annotations

from pathlib import Path

from flexdsa_core.toolchains.base import Toolchain

TOOLCHAIN = Toolchain(
    name="rockchip",
    description="rknn-toolkit2: RK3588 NPU compiler (.rknn) and its simulator, per shape bucket.",
    targets=("rockchip-rk3588",),
    requirements=(
        ("torch==2.13.0",),
        (
            "numpy==1.26.4",
            # rknn-toolkit2 imports pkg_resources, which setuptools 81 removed; torch wants >= 77.0.3.
            "setuptools>=77.0.3,<81",
            "onnx==1.18.0",
            "protobuf==4.25.4",
            "onnxruntime>=1.17.0,<1.24",
            "scipy>=1.9.3,<1.16",
            "opencv-python-headless>=4.5.5.64,<4.11",
            "fast-histogram>=0.11",
            "ruamel.yaml>=0.17.21",
            "psutil>=5.9.0",
            "tqdm>=4.64.1",
        ),
        ("--no-deps", "rknn-toolkit2==2.5.0"),
    ),
    driver=str(Path(__file__).with_name("driver.py")),
    version_of=("rknn-toolkit2", "torch", "onnx", "onnxruntime", "numpy"),
)
