"""Rockchip on the board: the bucket's ``.rknn`` through ``rknn-toolkit-lite2`` (``rknnlite``, over librknnrt).

NOT TESTED: no RK3588 is reachable from where this was written, and rknn-toolkit-lite2 only installs on the
board (aarch64). The calls are the documented ones: ``RKNNLite().load_rknn(path)``, ``init_runtime(core_mask=
NPU_CORE_AUTO)``, ``inference(inputs=[...], data_format=[...])`` with the inputs in the model's order (4-D
inputs as NCHW, as the compiler's simulator check gave them), ``release()``. Off the board, the same bucket
runs in rknn-toolkit2's simulator through ``bridge`` (backend ``rknn-simulator``), which is tested.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from flexdsa_runtime.errors import BackendUnavailable


def available() -> bool:
    try:
        import rknnlite.api  # noqa: F401
    except ImportError:
        return False
    return True


class RknnLiteBackend:
    name = "rknn-lite"

    def __init__(self, path: Path, inputs: list[dict], outputs: list[dict]) -> None:
        if not available():
            raise BackendUnavailable(
                "rknn-toolkit-lite2 is not installed: on the RK3588 board `pip install rknn-toolkit-lite2` (it "
                "needs the board's librknnrt.so); elsewhere use backend 'rknn-simulator' or 'onnxruntime'."
            )
        from rknnlite.api import RKNNLite

        self.rknn = RKNNLite()
        if self.rknn.load_rknn(str(path)) != 0:
            raise BackendUnavailable(f"RKNNLite could not load {path.name}")
        if self.rknn.init_runtime(core_mask=RKNNLite.NPU_CORE_AUTO) != 0:
            raise BackendUnavailable(
                "RKNNLite.init_runtime failed: is this an RK3588 with the NPU driver loaded?"
            )
        self.order = [i["name"] for i in inputs]
        self.input_dtypes = {i["name"]: np.dtype(i["dtype"]) for i in inputs if i.get("dtype")}
        self.output_names = [o["name"] for o in outputs]

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        arrays = [feeds[name] for name in self.order]
        found = self.rknn.inference(inputs=arrays, data_format=["nchw"] * len(arrays))
        if found is None:
            raise RuntimeError("RKNNLite.inference returned no outputs")
        return dict(zip(self.output_names, found, strict=True))

    def close(self) -> None:
        self.rknn.release()
