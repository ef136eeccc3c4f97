"""What a lower-precision model must keep against the fp32 original: ``AccuracyTarget`` (a request's
``accuracy``) and how each output is judged (``OutputMetric``, ``OutputSlice``).

The request's options (``options.OptimizeOptions.accuracy``) hold one; the scoring that judges a model by it
(``accuracy``) and the precision search read it. It sits below both, so that scoring never reaches up into
the request's options.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = ["AccuracyTarget", "Metric", "OutputMetric", "OutputSlice"]

Metric = Literal["cosine", "top1", "slices"]


class OutputSlice(BaseModel):
    """One quantity packed in an output: positions ``start:stop`` along the output's ``axis``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    start: int = Field(..., ge=0, description="First position of the slice along the axis.")
    stop: int = Field(..., ge=1, description="One past its last position.")
    metric: Literal["cosine", "top1"] = Field(
        "cosine", description="cosine of the slice with the original's; top1: argmax agreement over the slice."
    )

    @model_validator(mode="after")
    def _ordered(self) -> OutputSlice:
        if self.stop <= self.start:
            raise ValueError(f"a slice needs stop > start, got start {self.start}, stop {self.stop}")
        return self


class OutputMetric(BaseModel):
    """How one output is judged. ``cosine``: an embedding or any tensor, its cosine with the original's.
    ``top1``: a classifier, argmax agreement along ``axis`` (and the cosine). ``slices``: an output that packs
    unlike quantities (boxes in pixels and scores in 0..1 in one tensor): each named slice along ``axis`` is
    judged on its own, so a large quantity cannot hide the loss of a small one (and the whole by cosine)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    metric: Metric = Field(..., description="cosine, top1 or slices.")
    axis: int = Field(-1, description="The axis top-1 takes the argmax over, or the slices cut.")
    slices: dict[str, OutputSlice] | None = Field(
        None, description="metric 'slices': name -> {start, stop, metric}, not overlapping."
    )

    @model_validator(mode="after")
    def _slices(self) -> OutputMetric:
        if self.metric == "slices":
            if not self.slices:
                raise ValueError("metric 'slices' needs 'slices': {name: {start, stop}} naming each packed quantity")
            spans = sorted((s.start, s.stop, name) for name, s in self.slices.items())
            for (_, stop, first), (start, _, second) in zip(spans, spans[1:], strict=False):
                if start < stop:
                    raise ValueError(f"slices {first!r} and {second!r} overlap")
        elif self.slices:
            raise ValueError(f"'slices' is only for metric 'slices', not {self.metric!r}")
        return self


class AccuracyTarget(BaseModel):
    """What a lower-precision model must keep against the fp32 original, judged on samples the quantiser did
    not calibrate on (``holdout``).

    ``cosine(a, b) = a.b / (|a| |b|)`` of each output over all samples; top-1 agreement is the share of rows
    (every position but the argmax axis) whose argmax agrees, on classifier outputs: by default only on the
    rows where the original is confident (``top1_rows``), since a near-tie's argmax is a coin the original
    tossed too. With ``labels`` in the calibration file, the labelled top-1 output is judged against them
    instead: the candidate's accuracy must reach ``label_ratio`` of the original's (MLPerf's rule). ``outputs``
    names the metric per output; outputs it does not name are judged by their look (a float output named like
    'logits'/'probs'/'scores', or the only output when it is [batch, classes]: top-1; else cosine)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    min_cosine: float = Field(
        0.99, ge=0, le=1, description="Every output's cosine with the original (over every row, whatever the top-1 rule)."
    )
    min_sample_cosine: float | None = Field(
        None, ge=0, le=1,
        description="Each judged sample's cosine with the original, on every float output (the worst single sample "
        "must reach it: an embedding every input keeps, not only the pooled figure). None: not judged; the worst "
        "sample's cosine is reported either way.",
    )  # fmt: skip
    min_top1: float = Field(
        0.99, ge=0, le=1,
        description="Top-1 agreement with the original on classifier outputs: the share of the judged rows (see "
        "top1_rows) whose argmax agrees; both the share found and the share expected on unseen rows must reach it.",
    )  # fmt: skip
    top1_rows: Literal["confident", "all"] = Field(
        "confident",
        description="The rows top-1 agreement is judged on. confident: the rows where the original's top class has "
        "probability >= confident_probability (softmax of the output along its axis, unless it already is a "
        "distribution); with none, top-1 is not judged and the cosine decides, said in the report. all: every row, "
        "near-ties included. The all-rows figures are reported beside either way.",
    )
    confident_probability: float = Field(
        0.5, gt=0, le=1, description="top1_rows 'confident': the original's top-class probability a row needs."
    )
    label_ratio: float = Field(
        0.99, ge=0, le=1,
        description="With labels in the calibration file: the labelled output's accuracy (share of labelled rows whose "
        "argmax is the label) must reach this share of the original's accuracy on the same rows (MLPerf's rule: 0.99).",
    )
    labels_output: str | None = Field(
        None,
        description="The top-1 output the calibration file's labels refer to (judged by top-1 whatever its look). "
        "None: the one output judged by top-1 (labels with several such outputs are refused until one is named).",
    )
    top1_outputs: list[str] | None = Field(
        None,
        description="Outputs whose top-1 is checked. None: classifier outputs, i.e. a float output named like "
        "'logits'/'probs'/'scores', or the only output when it is [batch, classes].",
    )
    outputs: dict[str, OutputMetric] | None = Field(
        None,
        description="The metric per output, by name: 'cosine' (embeddings), 'top1' (classifiers) or "
        "{'metric': 'slices', 'axis': -1, 'slices': {'boxes': {'start': 0, 'stop': 4}, 'scores': {'start': 4, "
        "'stop': 5}}} (outputs packing unlike quantities, each slice judged alone). Names that are not outputs "
        "of the model are refused.",
    )

    @field_validator("outputs", mode="before")
    @classmethod
    def _shorthand(cls, outputs):
        """'top1' for {'metric': 'top1'}."""
        if isinstance(outputs, dict):
            return {name: {"metric": spec} if isinstance(spec, str) else spec for name, spec in outputs.items()}
        return outputs
