"""AMD Quark: quantises each bucket into the QDQ ONNX that the Ryzen AI NPU (Vitis AI EP) and the Vitis AI
DPU compiler take, and runs it in ONNX Runtime on the CPU.

The compilers themselves (the Vitis AI EP's NPU compiler, ``vai_c_xir``) do not install from the package
registry, so this toolchain stops at what does: Quark's power-of-two XINT8 / A8W8 quantisation on the
request's sample inputs, the quantised model as the bundle's artifact, and its outputs on the samples, which
the core holds against the original model's. Quark places no nodes, so no vendor placement comes back.

amd-quark 0.13 asks for onnx<=1.22 and numpy>=2 (its own pins, kept in this environment) and imports torch
for its custom-op loader without declaring it: the CPU build of torch goes in first so that no CUDA build is
fetched. onnxruntime is only in its optional extras; the driver needs it for calibration and the check.
"""

from __future__ import annotations

from pathlib import Path

from flexdsa_core.toolchains.base import Toolchain

TOOLCHAIN = Toolchain(
    name="amd",
    description="AMD Quark: XINT8 / A8W8 QDQ quantisation for the Ryzen AI NPU and the Vitis AI DPU, run in ORT.",
    targets=("amd-xdna2", "xilinx-kv260"),
    requirements=(
        ("torch==2.13.0",),
        ("amd-quark==0.13", "onnxruntime==1.28.0"),
    ),
    driver=str(Path(__file__).with_name("driver.py")),
    version_of=("amd-quark", "onnx", "onnxruntime", "numpy", "torch"),
    checks=(
        "quantised by the vendor quantiser {name!r} (AMD Quark) and run in ONNX Runtime; vendor scripts checked "
        "for syntax (the vendor compiler does not install here)"
    ),
)
