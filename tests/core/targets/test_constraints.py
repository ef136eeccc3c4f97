"""The generic op-constraint checker: each sourced limit refuses what breaks it, with a sentence, and
accepts what keeps it (ONNX defaults stand for missing attributes)."""

import onnx_ir as ir
import pytest

from flexdsa_core.targets.constraints import known_keys, violations
from tests.core.fusions.harness import parse


def _node(text: str) -> ir.Node:
    return list(ir.from_proto(parse(text)).graph)[0]


def _conv(kernel: int, group: int = 1, channels: int = 8, strides: int = 1) -> ir.Node:
    out_channels = channels
    per_group = channels // group
    return _node(f"""
<ir_version: 9, opset_import: ["" : 17]>
g (float[1, {channels}, 64, 64] x, float[{out_channels}, {per_group}, {kernel}, {kernel}] w) => (float[1, {out_channels}, 1, 1] y)
{{ y = Conv <group = {group}, strides = [{strides}, {strides}]> (x, w) }}
""")


def test_kernel_over_the_limit_is_refused_with_the_sizes():
    assert violations(_conv(33), {"kernel_max": 31}) == ["kernel 33x33 exceeds the limit of 31"]
    assert violations(_conv(31), {"kernel_max": 31}) == []


def test_depthwise_kernel_has_its_own_limit():
    depthwise = _conv(9, group=8)
    assert violations(depthwise, {"depthwise_kernel_max": 8}) == ["depthwise kernel 9x9 exceeds the limit of 8"]
    # The general kernel limit does not apply to depthwise convolutions, nor the depthwise one to others.
    assert violations(depthwise, {"kernel_max": 5}) == []
    assert violations(_conv(9), {"depthwise_kernel_max": 8}) == []


def test_stride_limit():
    assert violations(_conv(3, strides=8), {"stride_max": 7}) == ["stride 8 exceeds the limit of 7"]


def test_attr_in_uses_the_onnx_default_when_the_attribute_is_missing():
    pool = """
<ir_version: 9, opset_import: ["" : 17]>
g (float[1, 8, 16, 16] x) => (float[1, 8, 8, 8] y)
{{ y = MaxPool <kernel_shape = [2, 2], strides = [2, 2]{extra}> (x) }}
"""
    limits = {"attr_in": {"ceil_mode": [0], "auto_pad": ["NOTSET"]}}
    assert violations(_node(pool.format(extra="")), limits) == []
    assert violations(_node(pool.format(extra=", ceil_mode = 1")), limits) == [
        "ceil_mode=1 is not supported (only 0)"
    ]


def test_batch_rank_dim_and_elements():
    node = _node("""
<ir_version: 9, opset_import: ["" : 17]>
g (float[4, 10000, 3] x) => (float[4, 10000, 3] y)
{ y = Softmax <axis = -1> (x) }
""")
    assert violations(node, {"batch_max": 1}) == ["batch 4 exceeds the supported batch of 1"]
    assert violations(node, {"rank_max": 2}) == ["rank 3 exceeds the supported rank of 2"]
    assert violations(node, {"dim_max": 8192}) == ["dimension 10000 of 'x' exceeds the limit of 8192"]
    assert violations(node, {"elements_max": 100000}) == ["120000 elements exceed the limit of 100000"]
    assert violations(node, {"batch_max": 4, "dim_max": 10000}) == []


def test_const_inputs():
    node = _node("""
<ir_version: 9, opset_import: ["" : 17]>
g (float[1, 4] x, int64[4] pads) => (float[1, 8] y)
{ y = Pad (x, pads) }
""")
    assert violations(node, {"const_inputs": [1]}) == ["input 1 ('pads') must be a constant"]


def test_dtypes():
    node = _node("""
<ir_version: 9, opset_import: ["" : 17]>
g (int64[4] x) => (int64[4] y)
{ y = Relu (x) }
""")
    assert violations(node, {"dtypes": ["float32", "float16"]}) == [
        "input 'x' has dtype int64, supported: float32, float16"
    ]


@pytest.mark.parametrize("key", ["kernel_max", "attr_in", "const_inputs", "source"])
def test_spec_keys_are_known(key):
    assert key in known_keys()
