"""How a target wants its int8, as ONNX Runtime QDQ: declared by its adapter (``PlatformAdapter.int8_format``).

Where the vendor's own toolchain quantises (``vendor`` set: QNN, RKNN, Quark, AMCT), this QDQ is only its stand-in
here, close to the vendor's scheme, used to rank layers by sensitivity and to find how many must stay float
(``mixed``); what ships is the vendor's own quantisation, judged by its simulator/emulator. cpu-ort's format is
this machine's (``precision.formats.int8_format``), so its adapter declares none.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class Int8Format:
    """How a target wants its int8, as ONNX Runtime QDQ: activation and weight types, symmetry, granularity."""

    name: str
    activations: str  # "uint8" or "int8"
    symmetric: bool  # activations symmetric around zero (zero point 0), as TensorRT requires
    reduce_range: bool  # 7-bit weights (x86 without VNNI, see ``precision.formats``)
    runs_here: bool  # the target is this machine: candidates are timed, dynamic quantisation is one of them
    weights: str = "int8"  # "int8" or "uint8" (QNN's default)
    per_channel: bool = True
    vendor: str | None = None  # the vendor toolchain that quantises for real (None: this QDQ ships)
    float_as: str = "float32"  # what a layer kept out of int8 becomes on the target

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)
