"""What the core relies on where it reaches past the public API of onnxscript, onnx_ir, onnx and
onnxruntime (``flexdsa_core/_libraries.py``), pinned so that an upgrade changing it fails here, by name;
and that no other core module imports a private name of those libraries."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest
import sympy
from onnxscript.rewriter import MatchResult, RewriteRuleClassBase

from flexdsa_core import _libraries as lib

CORE = Path(__file__).resolve().parents[2] / "flexdsa_core"
LIBRARIES = ("onnxscript", "onnx_ir", "onnx", "onnxruntime")
_SIMPLIFY_MODULE = importlib.import_module("sympy.simplify.simplify")  # ``sympy.simplify`` is the function


def _graph() -> ir.Graph:
    """x (input), w (initializer), c (Constant node), s/v (scalar and [1] constants), y = computed."""
    model = onnx.parser.parse_model(
        """
        <ir_version: 9, opset_import: ["" : 17]>
        g (float[N, 3] x) => (float[N, 3] y)
        <float[3] w = {1.0, 2.0, 3.0}, float s = {0.5}, float[1] v = {2.0}>
        {
            c = Constant <value = float[3] {4.0, 5.0, 6.0}> ()
            t = Mul (x, w)
            y = Add (t, c)
        }
        """
    )
    return ir.serde.deserialize_model(model).graph


def _values() -> dict[str, ir.Value]:
    graph = _graph()
    values = {v.name: v for v in graph.inputs} | dict(graph.initializers)
    values |= {out.name: out for node in graph for out in node.outputs}
    return values


def test_get_numpy_value_reads_initializers_and_constant_nodes_not_inputs_or_computed_values():
    values = _values()
    np.testing.assert_array_equal(lib.get_numpy_value(values["w"]), [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(lib.get_numpy_value(values["c"]), [4.0, 5.0, 6.0])
    assert lib.get_numpy_value(values["x"]) is None
    assert lib.get_numpy_value(values["t"]) is None
    assert lib.get_numpy_value(None) is None


def test_get_singleton_value_takes_scalars_and_one_element_tensors_and_checks_rank():
    values = _values()
    assert lib.get_singleton_value(values["s"]) == 0.5
    assert lib.get_singleton_value(values["v"]) == 2.0
    assert lib.get_singleton_value(values["v"], rank=0) is None
    assert lib.get_singleton_value(values["v"], rank=(0, 1)) == 2.0
    assert lib.get_singleton_value(values["w"]) is None  # three elements
    assert lib.get_singleton_value(values["x"]) is None
    assert lib.is_singleton_value(values["s"], 0.5, rtol=1e-6)
    assert not lib.is_singleton_value(values["s"], 0.6, rtol=1e-6)
    assert lib.is_singleton_value(values["v"], lambda scalar: scalar > 1)


def test_has_rank_only_for_a_known_rank():
    values = _values()
    assert lib.has_rank(values["x"], 2)
    assert not lib.has_rank(values["x"], 3)
    assert not lib.has_rank(values["t"], 2)  # no shape inferred: rank unknown
    assert not lib.has_rank(None, 0)


def test_a_failed_match_result_carries_its_sentence():
    """Our checks answer ``MatchResult().fail(sentence)``; the switcher reads ``.reason`` and truthiness."""
    ok = MatchResult()
    assert ok and ok.reason == ""
    failed = MatchResult().fail("Initializer 'w' is also used outside the pattern.")
    assert not failed
    assert failed.reason == "Initializer 'w' is also used outside the pattern."


def test_onnxscript_rule_classes_we_subclass_are_rule_classes():
    for cls in (lib.FuseBatchNormIntoConv, lib.FuseBatchNormIntoConvTranspose, lib.FuseBatchNormIntoGemm,
                lib.MatMulAddToGemm, lib.TransAMatMulAddToGemm, lib.TransBMatMulAddToGemm,
                lib.TransABMatMulAddToGemm):  # fmt: skip
        assert issubclass(cls, RewriteRuleClassBase)
        assert callable(cls.check) and callable(cls.pattern)
    # matmul_gemm's checks read these flags of the variant they extend.
    assert (lib.TransAMatMulAddToGemm().trans_a, lib.TransBMatMulAddToGemm().trans_b) == (True, True)


def test_sympy_expression_of_a_symbolic_dim():
    """partial_shapes reads ``16*batch`` as a polynomial in integer dim symbols with integer coefficients."""
    polynomial = sympy.Poly(lib.sympy_expression(ir.SymbolicDim("16*batch")))
    assert [generator.name for generator in polynomial.gens] == ["batch"]
    assert polynomial.gens[0].is_integer
    assert polynomial.terms() == [((1,), 16)]
    assert lib.sympy_expression(ir.SymbolicDim(None)) is None


def test_onnx_tensors_lists_initializers_and_attribute_tensors():
    model = ir.serde.serialize_model(_graph_model())
    names = {tensor.name for tensor in lib.onnx_tensors(model)}
    assert {"w", "s", "v"} <= names
    assert len(list(lib.onnx_tensors(model))) == 4  # the three initializers and the Constant's value


def _graph_model() -> ir.Model:
    graph = _graph()
    return ir.Model(graph, ir_version=9)


def test_ort_cpu_kernels_are_the_cpu_providers_registry():
    kernels = lib.ort_kernels("CPUExecutionProvider")
    assert {("Conv", ""), ("MatMul", ""), ("LayerNormalization", "")} <= kernels
    assert ("SkipLayerNormalization", "com.microsoft") in kernels
    assert lib.ort_kernels("NoSuchExecutionProvider") == frozenset()


def test_ort_symbolic_shapes_resolve_a_dynamic_reshape():
    """Reshape(x, Concat(Shape(x)[0], [-1])) of x: [N, 4, 8] is [N, 32], which ONNX's inference loses."""
    model = onnx.parser.parse_model(
        """
        <ir_version: 9, opset_import: ["" : 17]>
        g (float[N, 4, 8] x) => (float[?, ?] y)
        <int64[1] rest = {-1}>
        {
            shape = Shape <start = 0, end = 1> (x)
            target = Concat <axis = 0> (shape, rest)
            r = Reshape (x, target)
            y = Relu (r)
        }
        """
    )
    inferred = lib.ort_symbolic_shapes(model)
    shapes = {
        info.name: [d.dim_param or d.dim_value for d in info.type.tensor_type.shape.dim]
        for info in [*inferred.graph.value_info, *inferred.graph.output]
    }
    assert shapes["r"] == ["N", 32]
    assert shapes["y"] == ["N", 32]


def test_ort_symbolic_shapes_leave_an_unknown_op_untyped():
    """An op it has no rule for gets an output without a tensor type, which shape_tracker skips (ONNX's
    answer stands), rather than a guessed shape."""
    model = onnx.parser.parse_model(
        """
        <ir_version: 9, opset_import: ["" : 17, "custom.domain" : 1]>
        g (float[N, 4] x) => (float[?, ?] y)
        { y = custom.domain.Mystery (x) }
        """
    )
    inferred = lib.ort_symbolic_shapes(model)
    assert [info.name for info in inferred.graph.output] == ["y"]
    assert not inferred.graph.output[0].type.HasField("tensor_type")


RESIZE = """
    <ir_version: 9, opset_import: ["" : 17]>
    g (float[1, 3, H, W] x) => (float[?, ?, ?, ?] y)
    <float[4] scales = {{1.0, 1.0, {scale}, {scale}}}>
    {{
        p = MaxPool <kernel_shape = [2, 2], strides = [2, 2]> (x)
        y = Resize <mode = "nearest"> (p, , scales)
    }}
"""


def _resized_dims(scale: str) -> list:
    inferred = lib.ort_symbolic_shapes(onnx.parser.parse_model(RESIZE.format(scale=scale)))
    return [d.dim_param or d.dim_value for d in inferred.graph.output[0].type.tensor_type.shape.dim]


def test_ort_symbolic_shapes_name_a_whole_scale_resize_exactly():
    """At a whole scale, Resize's ``floor(2.0*floor(H/2))`` is the exact ``2*floor(H/2)`` (the floor of an
    integer), without ``sympy.simplify``, which took up to 0.8 s per dim to return it unchanged; at a scale
    that is not whole, sympy decides as before."""
    assert _resized_dims("2.0") == [1, 3, "2*floor(H/2)", "2*floor(W/2)"]
    assert _resized_dims("1.5") == [1, 3, "floor(1.5*floor(H/2))", "floor(1.5*floor(W/2))"]


def test_whole_floats_are_made_integers_only_where_all_are_whole():
    h = sympy.Symbol("h", integer=True, nonnegative=True)
    exact = lib._integral_floats_exact
    assert exact(sympy.floor(2.0 * sympy.floor(h / 2))) == 2 * sympy.floor(h / 2)
    assert exact(sympy.floor(1.0 * h)) == h  # a Resize at scale 1 keeps its input's name
    assert exact(sympy.floor(1.5 * h)) is None  # not whole: sympy.simplify's to decide
    assert exact(sympy.floor(2.0 * h) + sympy.floor(0.5 * h)) is None
    assert exact(sympy.floor(h / 2)) is None  # no float at all
    assert exact(96) is None  # a plain number the inference hands over as it is


def test_ort_symbolic_shapes_let_go_of_what_sympy_remembered(monkeypatch):
    """``simplify``'s remembered answers serve the passes of one inference and go with it, not kept from one
    job to the next."""
    simplify = lib._symbolic_shape_inference_class().__init__.__globals__["sympy"].simplify
    remembered = []
    forget = lib._forget_symbolic_work

    def spy() -> None:
        remembered.append(simplify.cache_info().currsize)
        forget()

    monkeypatch.setattr(lib, "_forget_symbolic_work", spy)
    assert _resized_dims("1.5")[2:] == ["floor(1.5*floor(H/2))", "floor(1.5*floor(W/2))"]
    assert len(remembered) == 1 and remembered[0] >= 2  # both spatial dims were remembered on the way
    assert simplify.cache_info().currsize == 0  # and let go when it returned



def test_printing_is_worked_out_once_per_expression_during_an_inference_only(monkeypatch):
    """Inside ``_remembered_printing`` an expression's text is worked out once, each object answered with its
    own text (two expressions that compare equal can print differently); outside, and after an error,
    sympy prints as it did before."""
    from sympy.core._print_helpers import Printable

    plain = Printable.__str__
    printed = []

    def counted(expression) -> str:
        printed.append(expression)
        return plain(expression)

    monkeypatch.setattr(Printable, "__str__", counted)
    h = sympy.Symbol("h", integer=True)
    dim, short, long = sympy.floor(h / 2) + 2, sympy.Float("0.1", 3), sympy.Float("0.1", 30)
    with lib._remembered_printing():
        assert [str(dim) for _ in range(3)] == ["floor(h/2) + 2"] * 3
        assert (str(short), str(long)) == (plain(short), plain(long)) and str(short) != str(long)
        assert str(short) == plain(short)
    ids = [id(expression) for expression in printed]  # (sympy prints some parts through str() as well)
    assert len(ids) == len(set(ids)) and {id(dim), id(short), id(long)} <= set(ids)  # each worked out once
    assert Printable.__str__ is counted  # put back as found
    str(dim)
    assert printed.count(dim) == 2  # and outside, printed each time again
    _fail_inside(lib._remembered_printing)
    assert Printable.__str__ is counted


def test_ort_symbolic_shapes_remember_printing_only_while_they_run():
    from sympy.core._print_helpers import Printable

    plain, simplify = Printable.__str__, _SIMPLIFY_MODULE.simplify
    assert _resized_dims("2.0")[2:] == ["2*floor(H/2)", "2*floor(W/2)"]
    assert Printable.__str__ is plain
    assert _SIMPLIFY_MODULE.simplify is simplify


def test_sympys_recursive_simplify_answers_each_part_once_during_an_inference_only(monkeypatch):
    """Inside ``_remembered_simplify``, sympy's recursion into a nest of floors (a strided conv's output dims
    after four convs) asks for each part once, and the answer is sympy's own; outside, and after an error,
    every part is simplified each time it is reached, as before."""
    plain = _SIMPLIFY_MODULE.simplify
    asked = []

    def counted(expression, *args, **kwargs):
        asked.append(expression)
        return plain(expression, *args, **kwargs)

    monkeypatch.setattr(_SIMPLIFY_MODULE, "simplify", counted)
    h = sympy.Symbol("h", integer=True, nonnegative=True)
    half = sympy.Rational(1, 2)
    nest = sympy.floor(h / 2 - half)
    for _ in range(2):
        nest = sympy.floor(nest / 2)
    dim = sympy.floor(nest / 2 + half)
    before = counted(dim)
    outside = len(asked)
    with lib._remembered_simplify():
        inside = [_SIMPLIFY_MODULE.simplify(dim), _SIMPLIFY_MODULE.simplify(dim)]
    parts = asked[outside:]
    assert inside == [before, before] and str(inside[0]) == str(before)
    assert len(parts) == len({(type(p), p) for p in parts})  # each part worked out once
    assert len(parts) < outside  # where sympy alone works some out again
    assert _SIMPLIFY_MODULE.simplify is counted  # put back as found
    counted(dim)
    assert len(asked) == len(parts) + 2 * outside  # and outside, each part again
    _fail_inside(lib._remembered_simplify)
    assert _SIMPLIFY_MODULE.simplify is counted


def _fail_inside(context) -> None:
    """Enter ``context`` and fail inside it, as an inference does on an op it has no rule for."""
    with pytest.raises(RuntimeError), context():
        raise RuntimeError("an op the inference has no rule for")


def _private_imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] not in LIBRARIES:
                continue
            private_module = any(part.startswith("_") for part in node.module.split("."))
            private_names = [alias.name for alias in node.names if alias.name.startswith("_")]
            if private_module or private_names:
                found.append(f"line {node.lineno}: from {node.module} import {', '.join(a.name for a in node.names)}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] in LIBRARIES and any(part.startswith("_") for part in parts):
                    found.append(f"line {node.lineno}: import {alias.name}")
    return found


def test_only_the_adapter_imports_private_names_of_the_libraries():
    offenders = {
        str(path.relative_to(CORE.parent)): found
        for path in sorted(CORE.rglob("*.py"))
        if path.name != "_libraries.py" and (found := _private_imports(path))
    }
    assert not offenders, f"import these through flexdsa_core/_libraries.py (or a public name): {offenders}"


def test_the_private_import_check_sees_them(tmp_path):
    """The check above catches the forms the core used before the adapter, and passes public imports."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from onnxscript.rewriter import _ir_utils\n"
        "from onnxscript.rewriter._basics import MatchResult\n"
        "import onnxruntime.capi._pybind_state\n"
        "from onnx_ir import Value\n"
        "from onnxscript.rewriter import MatchResult\n"
    )
    assert [line.split(":")[0] for line in _private_imports(probe)] == ["line 1", "line 2", "line 3"]


def test_a_rules_root_op_type_is_the_op_its_pattern_ends_at():
    """The fusion driver skips nodes of another op type than a rule variant's root: that root must be the
    pattern's output node, for single- and multi-output patterns alike."""
    from onnxscript.rewriter import RewriteRule

    def relu_of_add(op, x, y):
        return op.Relu(op.Add(x, y))

    def replacement(op, x, y):
        return op.Relu(op.Add(y, x))

    assert lib.rule_root_op_type(RewriteRule(relu_of_add, replacement)) == "Relu"
    from flexdsa_core.fusions import discover_rules

    roots = {rule.name: {lib.rule_root_op_type(r) for r in rule.rewrite_rules} for rule in discover_rules()}
    assert roots["skip_layer_norm"] == {"LayerNormalization"} and roots["conv_bn_fold"] == {"BatchNormalization"}
    assert roots["layer_norm"] == {"Mul", "Add", "Div"}
    # commute=True clones keep their op as a pattern, not a string (no op_identifier): found all the same, so
    # no variant of the library is tried on every node
    assert None not in set().union(*roots.values())


def test_a_rules_op_types_are_those_every_match_holds():
    """A pattern's nodes reached through node outputs alone must all match; an ``OrValue``'s alternatives need
    not (the pattern's own node list holds them too, so reading it would skip a rule that can match)."""
    from onnxscript.rewriter import RewriteRule, pattern

    def scaled(op, x, y):
        inverse = pattern.OrValue([op.Reciprocal(y), op.Div(1.0, y)])
        return op.Relu(op.Mul(x, inverse))

    def replacement(op, x, y):
        return op.Relu(op.Div(x, y))

    assert lib.rule_op_types(RewriteRule(scaled, replacement)) == {"Relu", "Mul"}
    from flexdsa_core.fusions import discover_rules

    needs = {rule.name: {lib.rule_op_types(r) for r in rule.rewrite_rules} for rule in discover_rules()}
    assert frozenset({"MatMul", "Reshape", "Transpose"}) in needs["attention"]
    assert needs["silu"] == {frozenset({"Mul", "Sigmoid"})}
    assert all("Reciprocal" not in need for need in needs["layer_norm"])  # an alternative of Div


def test_the_known_shapes_folder_leaves_the_graph_onnxscripts_folder_leaves():
    """``KnownShapesFoldConstantsPass`` skips ONNX inference of nodes whose outputs are already known: on an
    inferred model it must fold the same and leave the same shapes as ``fold_constants(onnx_shape_inference=True)``
    (a changed ``FoldConstantsPass._do_inference`` contract would show here)."""
    from onnxscript.optimizer import fold_constants

    from flexdsa_core.ingest import ingest
    from flexdsa_core.shape_tracker import ShapeTracker
    from flexdsa_core.targets import load_target
    from tests.models import fixture

    def inferred():
        tracker = ShapeTracker(ingest(str(fixture("bert"))).model)
        tracker.infer()
        [bucket] = tracker.buckets(None, load_target("cpu-ort"))
        return tracker.specialize(bucket)

    ours, theirs = inferred(), inferred()
    options = {"input_size_limit": 1 << 20, "output_size_limit": 1 << 20}
    assert lib.KnownShapesFoldConstantsPass(shape_inference=True, **options)(ours).modified
    fold_constants(theirs, onnx_shape_inference=True, **options)
    assert ir.to_proto(ours).SerializeToString() == ir.to_proto(theirs).SerializeToString()


def test_the_known_shapes_folder_asks_onnx_again_only_when_the_question_changed(monkeypatch):
    """A node whose outputs ONNX cannot size (a convolution over symbolic spatial dims: ``unk__`` dims) is
    inferred once, not again on every sweep; once its input's shape changes, or its output's shape is taken
    away, it is inferred again, and the answer is the one the library gives."""
    from onnxscript.optimizer import _constant_folding

    model = ir.serde.deserialize_model(onnx.parser.parse_model(
        """
        <ir_version: 9, opset_import: ["" : 17]>
        g (float[N, 3, H, W] x) => (float y)
        <float[8, 3, 3, 3] w = {...}>
        {
            c = Conv <strides = [2, 2]> (x, w)
            y = Relu (c)
        }
        """.replace("{...}", "{" + ", ".join(["0.5"] * 216) + "}")
    ))  # fmt: skip
    model.graph.outputs[0].shape = None  # the text form cannot leave it out
    plain = _constant_folding.FoldConstantsPass._do_inference
    asked: list[str] = []

    def counted(self, node):
        asked.append(node.op_type)
        return plain(self, node)

    monkeypatch.setattr(_constant_folding.FoldConstantsPass, "_do_inference", counted)

    def fold():
        lib.KnownShapesFoldConstantsPass(shape_inference=True, input_size_limit=1024, output_size_limit=1024)(model)

    conv = next(node for node in model.graph if node.op_type == "Conv")
    fold()
    assert asked == ["Conv", "Relu"]
    first = conv.outputs[0].shape
    assert first is not None and first[1] == 8 and not first.is_static()  # ONNX cannot size (H - 1)/2 + 1
    fold()
    fold()
    assert asked == ["Conv", "Relu"]  # the same question: not asked again
    assert conv.outputs[0].shape == first
    conv.outputs[0].shape = None  # the output's state changed: asked again, and given the same answer
    fold()
    assert asked[2:] == ["Conv"] and conv.outputs[0].shape == first
    model.graph.inputs[0].shape = ir.Shape([1, 3, 32, 32])  # the input's shape changed: asked again
    fold()
    assert conv.outputs[0].shape == ir.Shape([1, 8, 15, 15]) and asked[3:] == ["Conv", "Relu"]
