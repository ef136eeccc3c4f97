"""Qualcomm Snapdragon 8 Gen 3 (SM8650) Hexagon NPU through ONNX Runtime's QNN execution provider."""

from __future__ import annotations

from flexdsa_core.targets.accelerator import AcceleratorAdapter
from flexdsa_core.targets.spec import TargetSpec

# QNN HTP architecture and SoC id of the Snapdragon 8 Gen 3 (QNN EP provider options htp_arch / soc_model).
HTP_ARCH = "75"
SOC_MODEL = "57"


class QualcommAdapter(AcceleratorAdapter):
    vendor = "Qualcomm"

    def toolchain_options(self, target: TargetSpec, report: dict) -> dict:
        return {
            "precision": "int8",
            "activation_type": "auto",
            "provider": {"backend_type": "htp", "htp_arch": HTP_ARCH, "soc_model": SOC_MODEL},
        }


ADAPTER = QualcommAdapter()
