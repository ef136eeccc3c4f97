"""What every backend offers the runtime: run one bucket's artifact on padded inputs, by input name."""

from __future__ import annotations

from typing import Protocol

import numpy as np

# ONNX Runtime's type strings -> numpy dtypes, for casting a request's arrays to what the model takes.
ORT_DTYPES = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(double)": np.float64,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(int16)": np.int16,
    "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8,
    "tensor(uint16)": np.uint16,
    "tensor(bool)": np.bool_,
}


class Backend(Protocol):
    """One loaded bucket. ``name`` says which runtime runs it (the traffic report and the bench show it)."""

    name: str
    input_dtypes: dict[str, np.dtype]
    output_names: list[str]

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]: ...

    def close(self) -> None: ...


class SessionBackend:
    """A backend over one ONNX Runtime session (on the CPU, or on a vendor's execution provider): its inputs'
    dtypes and output names come from the session, and a run is the session's run by name."""

    def _serve(self, session) -> None:
        self.session = session
        self.input_dtypes = {i.name: np.dtype(ORT_DTYPES.get(i.type, np.float32)) for i in session.get_inputs()}
        self.output_names = [o.name for o in session.get_outputs()]

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(zip(self.output_names, self.session.run(self.output_names, feeds), strict=True))

    def close(self) -> None:
        self.session = None
