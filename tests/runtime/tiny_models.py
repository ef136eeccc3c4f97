"""Tiny models for the runtime tests, written as ONNX text: one whose padding a mask makes harmless, one
whose outputs padding changes, one that needs the other mask convention (1 = ignore)."""

from __future__ import annotations

import functools

from tests.core.fusions.harness import parse

# Per-position output (y = 2x, cropped back) and a mean over the positions the mask keeps (z): padding the
# sequence with mask 0 changes neither.
MASKED = """
<ir_version: 9, opset_import: ["" : 17]>
masked (float[batch, seq, 4] x, int64[batch, seq] attention_mask) => (float[batch, seq, 4] y, float[batch, 4] z)
{ two = Constant <value = float {2.0}> ()
  y = Mul (x, two)
  m = Cast <to = 1> (attention_mask)
  axes = Constant <value = int64[1] {2}> ()
  m3 = Unsqueeze (m, axes)
  kept = Mul (x, m3)
  one = Constant <value = int64[1] {1}> ()
  total = ReduceSum <keepdims = 0> (kept, one)
  count = ReduceSum <keepdims = 1> (m, one)
  z = Div (total, count) }
"""

# A mean over every position, mask or not: a padded request gets another answer.
UNMASKED = """
<ir_version: 9, opset_import: ["" : 17]>
unmasked (float[batch, seq, 4] x) => (float[batch, 4] z)
{ one = Constant <value = int64[1] {1}> ()
  total = ReduceSum <keepdims = 0> (x, one)
  count = Shape <start = 1, end = 2> (x)
  countf = Cast <to = 1> (count)
  z = Div (total, countf) }
"""

# A mask where 1 means "ignore": padding it with 0 would count the padded positions, 1 is right.
IGNORE_MASK = """
<ir_version: 9, opset_import: ["" : 17]>
ignore_mask (float[batch, seq, 4] x, int64[batch, seq] ignore_mask) => (float[batch, 4] z)
{ m = Cast <to = 1> (ignore_mask)
  onef = Constant <value = float {1.0}> ()
  keep = Sub (onef, m)
  axes = Constant <value = int64[1] {2}> ()
  keep3 = Unsqueeze (keep, axes)
  shifted = Add (x, onef)
  kept = Mul (shifted, keep3)
  one = Constant <value = int64[1] {1}> ()
  z = ReduceSum <keepdims = 0> (kept, one) }
"""

# A learned position table of 16 rows sliced to the sequence and added: the model itself takes seq <= 16.
POSITIONED = """
<ir_version: 9, opset_import: ["" : 17]>
positioned (float[batch, seq, 4] x) => (float[batch, seq, 4] y)
<float[16, 4] table = {0.0, 0.1, 0.2, 0.3, 1.0, 1.1, 1.2, 1.3, 2.0, 2.1, 2.2, 2.3, 3.0, 3.1, 3.2, 3.3,
                       4.0, 4.1, 4.2, 4.3, 5.0, 5.1, 5.2, 5.3, 6.0, 6.1, 6.2, 6.3, 7.0, 7.1, 7.2, 7.3,
                       8.0, 8.1, 8.2, 8.3, 9.0, 9.1, 9.2, 9.3, 10.0, 10.1, 10.2, 10.3, 11.0, 11.1, 11.2, 11.3,
                       12.0, 12.1, 12.2, 12.3, 13.0, 13.1, 13.2, 13.3, 14.0, 14.1, 14.2, 14.3, 15.0, 15.1, 15.2, 15.3},
 int64[1] zero = {0}, int64[1] start = {0}>
{ shape = Shape (x)
  one_index = Constant <value = int64 {1}> ()
  seq = Gather <axis = 0> (shape, one_index)
  end = Unsqueeze (seq, zero)
  rows = Slice (table, start, end)
  y = Add (x, rows) }
"""


def model_bytes(text: str) -> bytes:
    return parse(text).SerializeToString()


@functools.cache
def masked_bundle(target: str = "cpu-ort") -> dict[str, bytes]:
    """MASKED compiled for ``target`` with buckets seq 8 and 16 (batch 1): the bundle's files by name, for tests
    that play the worker's hand-over of a real bundle."""
    from pathlib import Path

    from flexdsa_core import FlexDSAOptimizer, RequestSpec

    request = RequestSpec.model_validate(
        {"target": target, "shape_buckets": {"batch": [1], "seq": [8, 16]}, "measure_latency": False}
    )
    result = FlexDSAOptimizer(request.target_spec()).optimize(model_bytes(MASKED), request.options())
    return {
        name: content.read_bytes() if isinstance(content, Path) else content
        for name, content in result.artifacts.items()
    }
