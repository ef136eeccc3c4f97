"""The one registry of rewrites (``rewrites.py``, ``registry.py``): every pass, fusion rule and target
legalisation is a declared ``Rewrite``; ``after`` orders them and a circle is refused; ``disabled_rules``
and ``GET /targets/{name}`` list exactly the registry; and adding one of each kind is one declared object,
shown end to end below (it is listed, switchable, applied and reported)."""

from __future__ import annotations

import dataclasses

import onnx
import onnx_ir as ir
import pytest

from flexdsa_core import FlexDSAOptimizer, OptimizeOptions
from flexdsa_core.cache import LRUCache
from flexdsa_core.errors import InvalidOptionsError
from flexdsa_core.fusions import discover_rules, make_rule
from flexdsa_core.options import OptimizeOptions as Options
from flexdsa_core.passes import GENERIC_PASSES
from flexdsa_core.preflight import check_disabled, switchable_names
from flexdsa_core.registry import Registry
from flexdsa_core.rewrites import (
    Legalisation,
    OrderError,
    PassRewrite,
    Rewrite,
    check_after,
    counting,
    ordered,
)
from flexdsa_core.targets import list_targets
from flexdsa_core.targets.cpu_ort.adapter import CpuOrtAdapter
from flexdsa_core.targets.rockchip.adapter import _sum_to_add

TARGETS = [spec.name for spec in list_targets()]


def _rewrite(name: str, *after: str) -> Rewrite:
    return Rewrite(name=name, kind="fusion", after=after)


# -- ordering ------------------------------------------------------------------------------------------


def test_after_orders_and_ties_keep_declaration_order():
    names = [r.name for r in ordered([_rewrite("c", "b"), _rewrite("a"), _rewrite("b"), _rewrite("d")])]
    assert names == ["a", "b", "c", "d"]


def test_a_circle_is_refused_and_named():
    with pytest.raises(OrderError, match=r"circle: a -> b -> a"):
        ordered([_rewrite("a", "b"), _rewrite("b", "a"), _rewrite("c")])


def test_a_name_declared_twice_is_refused():
    with pytest.raises(OrderError, match="declared twice"):
        ordered([_rewrite("a"), _rewrite("a")])


def test_after_must_name_a_declared_rewrite_of_its_kind():
    with pytest.raises(OrderError, match="not a declared fusion"):
        check_after([_rewrite("a", "typo")])
    # A caller may order a subset: an 'after' naming a rewrite it left out does not bind.
    assert [r.name for r in ordered([_rewrite("b", "left_out")])] == ["b"]


@pytest.mark.parametrize("target", TARGETS)
def test_every_target_registry_is_consistent(target):
    registry = Registry(target)
    registry.check()
    assert registry.names() == switchable_names(target)
    assert [len(registry.names()[key]) for key in ("passes", "fusions")] == [len(GENERIC_PASSES), len(discover_rules())]


def test_each_pass_is_the_onnx_ir_pass_its_declaration_names():
    for declared in GENERIC_PASSES:
        made = declared.make(Options())
        assert isinstance(made, ir.passes.PassBase) and made.name == declared.name


def test_fusion_rules_follow_what_they_build_on():
    names = [rule.name for rule in discover_rules()]
    assert names.index("layer_norm") < names.index("skip_layer_norm") < names.index("attention")
    assert names.index("gelu_erf") < names.index("bias_gelu")
    assert names[-1] == "transpose_matmul_fused"


def test_float_only_rewrites_come_from_their_declaration():
    assert Registry("cpu-ort").float_only() == {"ort_layout"}
    assert Registry("rockchip-rk3588").float_only() == frozenset()


# -- adding one of each kind is one declared object ------------------------------------------------


def _sum_model() -> bytes:
    graph = onnx.helper.make_graph(
        [
            onnx.helper.make_node("Relu", ["x"], ["r"]),
            onnx.helper.make_node("Sum", ["x", "r", "x"], ["y"]),
        ],
        "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 8])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 8])],
    )
    return onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)]).SerializeToString()


SUM_TO_ADD = counting("test_sum_to_add", _sum_to_add, "Sum(a, b, ...) -> Add(Add(a, b), ...).")


def _ops(result) -> list[str]:
    return [node.op_type for node in onnx.load_from_string(result.artifact_bytes("model.onnx")).graph.node]


def test_adding_a_legalisation_is_one_declared_object(monkeypatch):
    monkeypatch.setattr(CpuOrtAdapter, "legalisations", (*CpuOrtAdapter.legalisations, SUM_TO_ADD))
    assert switchable_names("cpu-ort")["target"][-1] == "test_sum_to_add"
    check_disabled(["test_sum_to_add"], "cpu-ort")  # accepted by disabled_rules
    options = OptimizeOptions(measure_latency=False, calibrate=False)
    taken = FlexDSAOptimizer("cpu-ort").optimize(_sum_model(), options, cache=LRUCache())
    assert "Sum" not in _ops(taken) and _ops(taken).count("Add") == 2  # and it validated, or it would raise
    assert taken.report["rewrites_applied_by_kind"]["legalisation"] == ["test_sum_to_add"]
    assert "test_sum_to_add: 1 node(s)" in taken.report["legalization"]["static"]
    off = FlexDSAOptimizer("cpu-ort").optimize(
        _sum_model(), options.model_copy(update={"disabled_rules": ["test_sum_to_add"]}), cache=LRUCache()
    )
    assert "Sum" in _ops(off) and "test_sum_to_add" not in off.report["rewrites_applied"]


def test_adding_a_pass_is_one_declared_object(monkeypatch):
    import flexdsa_core.registry as registry_module

    class ReluTwice(ir.passes.InPlacePass):
        """Relu(Relu(x)) -> Relu(x)."""

        name = "test_relu_twice"

        def call(self, model):
            modified = False
            for node in list(model.graph):
                inner = node.inputs[0].producer() if node.op_type == "Relu" else None
                if inner is not None and inner.op_type == "Relu":
                    node.replace_input_with(0, inner.inputs[0])
                    modified = True
            return ir.passes.PassResult(model, modified)

    added = PassRewrite(name="test_relu_twice", summary=ReluTwice.__doc__, after=("cse",), make=lambda o: ReluTwice())
    # Declared last, ready with dead_code once cse has run: ties keep declaration order.
    monkeypatch.setattr(registry_module, "GENERIC_PASSES", (*GENERIC_PASSES, added))
    registry = Registry("cpu-ort")
    assert registry.names()["passes"][-2:] == ["dead_code", "test_relu_twice"]
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Relu", ["x"], ["a"]), onnx.helper.make_node("Relu", ["a"], ["y"])], "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 8])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 8])],
    )  # fmt: skip
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)]).SerializeToString()
    result = FlexDSAOptimizer("cpu-ort").optimize(model, OptimizeOptions(measure_latency=False, calibrate=False))
    assert _ops(result) == ["Relu"]
    assert "test_relu_twice" in result.report["rewrites_applied_by_kind"]["pass"]


def test_adding_a_fusion_rule_is_one_declared_object():
    from onnxscript.rewriter import RewriteRuleClassBase

    class _SumOfTwo(RewriteRuleClassBase):
        """Sum(a, b) -> Add(a, b)."""

        def pattern(self, op, a, b):
            return op.Sum(a, b)

        def rewrite(self, op, a, b):
            return op.Add(a, b)

    rule = make_rule("test_sum_of_two", _SumOfTwo.__doc__, ["Add"], [_SumOfTwo.rule()], after=("weighted_sum",))
    registry = Registry("cpu-ort", (rule, *discover_rules()))  # declared first, ordered by its 'after'
    fusions = registry.names()["fusions"]
    assert registry.kind_of("test_sum_of_two") == "fusion"
    assert fusions.index("test_sum_of_two") == fusions.index("weighted_sum") + 1
    model = ir.serde.deserialize_model(onnx.load_from_string(_sum_model()))
    assert rule.apply(model) == 0  # a three-input Sum is not its pattern
    two = onnx.helper.make_model(onnx.helper.make_graph(
        [onnx.helper.make_node("Sum", ["x", "x"], ["y"])], "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 8])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 8])],
    ), opset_imports=[onnx.helper.make_opsetid("", 17)])  # fmt: skip
    model = ir.serde.deserialize_model(two)
    assert rule.apply(model) == 1 and [n.op_type for n in model.graph] == ["Add"]
    with pytest.raises(OrderError, match="circle"):
        Registry("cpu-ort", (dataclasses.replace(rule, after=("silu",)),
                             *[dataclasses.replace(r, after=(*r.after, "test_sum_of_two")) if r.name == "silu" else r
                               for r in discover_rules()]))  # fmt: skip


def test_an_unknown_name_in_disabled_rules_is_refused_with_the_known_ones():
    with pytest.raises(InvalidOptionsError, match="pin_residual_sum"):
        check_disabled(["no_such_rewrite"], "cpu-ort")


def test_legalisation_declarations_are_rewrites():
    assert all(isinstance(r, Legalisation) and r.kind == "legalisation" for r in Registry("rockchip-rk3588").legalisations)
    assert Registry("rockchip-rk3588").names()["target"] == ["pad_into_conv", "gelu_erf_div_form", "neg_to_mul", "sum_to_add"]
