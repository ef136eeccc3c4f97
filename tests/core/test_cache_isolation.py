"""Kernel-cache poisoning across targets that share a name.

The attack: a tenant sends a custom target named ``rockchip-rk3588`` with a memory bandwidth and peak
throughput of 1; its figures land in the shared kernel cache under the built-in's name and version, and the
next tenant's real rk3588 job reads them (an estimate of hours instead of microseconds). Refused at the
request (a custom target cannot take a built-in's name), and, whatever builds a spec, every cache key
carries a hash of the whole spec's content, so two specs that differ in anything never share an entry.
"""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from flexdsa_core import FlexDSAOptimizer, RequestSpec, TargetSpec, load_target
from flexdsa_core.cache import LRUCache, kernel_key
from flexdsa_core.errors import InvalidOptionsError

OPTIONS = RequestSpec.model_validate({"target": "rockchip-rk3588", "measure_latency": False}).options()


def _conv_relu() -> bytes:
    weights = np.random.default_rng(0).standard_normal((8, 3, 3, 3)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Relu", ["c"], ["y"])],
        "conv_relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 14, 14])],
        [numpy_helper.from_array(weights, "w")],
    )
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9
    ).SerializeToString()


def _poisoned(name: str = "rockchip-rk3588") -> dict:
    """The built-in rk3588 as a request's custom target, with a bandwidth and every peak of 1."""
    real = load_target("rockchip-rk3588")
    data = real.model_dump(mode="json")
    data.update(
        name=name, mem_bandwidth_bytes_per_s=1.0, peak_ops_per_s=dict.fromkeys(real.peak_ops_per_s, 1.0)
    )
    return data


def _latency(target: TargetSpec, cache=None) -> dict[str, float]:
    report = FlexDSAOptimizer(target).optimize(_conv_relu(), OPTIONS, cache=cache).report
    return {
        bucket: entry["on_target"]["latency_s"] for bucket, entry in report["estimates"]["per_bucket"].items()
    }


def test_a_custom_target_cannot_take_a_builtin_name():
    request = RequestSpec.model_validate({"target": _poisoned()})
    with pytest.raises(InvalidOptionsError) as refused:
        request.target_spec()
    assert refused.value.message.startswith(
        "'rockchip-rk3588' is a built-in target; give your custom target another name"
    )
    assert refused.value.http_status == 422
    # Under a name of its own the same spec is an ordinary custom target.
    mine = RequestSpec.model_validate({"target": _poisoned("my-rk3588")}).target_spec()
    assert mine.name == "my-rk3588" and mine.mem_bandwidth_bytes_per_s == 1.0


def test_kernel_keys_carry_the_whole_spec_not_its_name():
    real = load_target("rockchip-rk3588")
    poisoned = TargetSpec.model_validate(_poisoned())  # a spec built in the core, past the request's check
    assert (poisoned.name, poisoned.version) == (real.name, real.version)
    canonical = {"op": "Conv", "shapes": [[1, 3, 16, 16], [8, 3, 3, 3]]}
    assert kernel_key(canonical, real, "0.1.0") != kernel_key(canonical, poisoned, "0.1.0")
    assert real.spec_hash() != poisoned.spec_hash()  # the whole-job cache's part of its key
    # The hash is of the content in canonical form: the same spec with its keys in another order is the same.
    shuffled = real.model_dump(mode="json")
    shuffled["peak_ops_per_s"] = dict(reversed(list(shuffled["peak_ops_per_s"].items())))
    same = TargetSpec.model_validate(dict(reversed(list(shuffled.items()))))
    assert same.content_sha256 == real.content_sha256 and same.spec_hash() == real.spec_hash()
    assert kernel_key(canonical, same, "0.1.0") == kernel_key(canonical, real, "0.1.0")
    # A copy with other figures is another spec, even though it was copied from one already hashed.
    edited = real.model_copy(update={"mem_bandwidth_bytes_per_s": 1.0})
    assert edited.content_sha256 != real.content_sha256


def test_a_poisoned_entry_is_not_read_by_the_real_target():
    shared = LRUCache()
    poisoned = _latency(TargetSpec.model_validate(_poisoned()), shared)
    fresh = _latency(load_target("rockchip-rk3588"))
    assert poisoned != fresh  # the poisoned figures are absurd: what must not leak
    assert _latency(load_target("rockchip-rk3588"), shared) == fresh
