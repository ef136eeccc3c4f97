"""The one place the core reaches past the public API of onnxscript, onnx_ir, onnx and onnxruntime.

Each name here wraps a private name of one of those libraries that has no public equivalent in the
pinned versions, and its docstring says what we rely on. ``tests/core/test_libraries.py`` pins that
behaviour, so an upgrade that changes it fails there, naming the library function, rather than as a
wrong fusion or a lost shape deep in a model test. No other module of ``flexdsa_core`` imports a private
name of these libraries (``tests/test_imports.py`` checks); what they export publicly (``MatchResult``,
``RewriteRuleClassBase``, ``MatchingTracer`` from ``onnxscript.rewriter``...) is imported from there.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
from onnxscript.optimizer import _constant_folding
from onnxscript.rewriter import _ir_utils
from onnxscript.rewriter._pattern_ir import NodeOutputPattern, StringConstantPattern

# onnxscript's rule classes, which our conv_bn and matmul_gemm rules subclass for the pattern and the
# checks they already make; the library exports only instances of them (``fuse_batchnorm_into_conv_rule``).
from onnxscript.rewriter.rules.common._fuse_batchnorm import (
    FuseBatchNormIntoConv,
    FuseBatchNormIntoConvTranspose,
    FuseBatchNormIntoGemm,
)
from onnxscript.rewriter.rules.common._matmul_add_to_gemm import (
    MatMulAddToGemm,
    TransABMatMulAddToGemm,
    TransAMatMulAddToGemm,
    TransBMatMulAddToGemm,
)

__all__ = [
    "FuseBatchNormIntoConv",
    "FuseBatchNormIntoConvTranspose",
    "FuseBatchNormIntoGemm",
    "KnownShapesFoldConstantsPass",
    "MatMulAddToGemm",
    "TransABMatMulAddToGemm",
    "TransAMatMulAddToGemm",
    "TransBMatMulAddToGemm",
    "get_numpy_value",
    "get_singleton_value",
    "has_rank",
    "is_singleton_value",
    "onnx_tensors",
    "ort_kernels",
    "rule_op_types",
    "rule_root_op_type",
    "ort_symbolic_shapes",
    "sympy_expression",
]


# -- onnxscript: reading constants inside a rule's check ---------------------------------------------


def get_numpy_value(value: ir.Value | None) -> np.ndarray | None:
    """The array a value holds when it is constant: an initializer's data or a Constant node's output
    (onnxscript propagates the Constant into ``const_value`` first); None for a graph input without data,
    a computed value, None itself, or external data whose file is missing."""
    return _ir_utils.get_numpy_value(value)


def get_singleton_value(value: ir.Value | None, rank: int | Sequence[int] | None = None):
    """The Python scalar of a one-element constant (a scalar or a ``[1]`` tensor), else None; with ``rank``
    only when the constant has that rank (or one of those ranks)."""
    return _ir_utils.get_singleton_value(value, rank=rank)


def is_singleton_value(value: ir.Value | None, expected, *, rtol: float | None = None, rank=None) -> bool:
    """Whether ``value`` is a one-element constant equal to ``expected`` (an int exactly, a float within
    ``rtol``, or a predicate on the scalar)."""
    return _ir_utils.is_singleton_value(value, expected, rtol=rtol, rank=rank)


def has_rank(value: ir.Value | None, rank: int) -> bool:
    """Whether the value's rank is statically known and equal to ``rank`` (False for None or no shape)."""
    return _ir_utils.has_rank(value, rank)


# -- onnx_ir / onnx ---------------------------------------------------------------------------------


def rule_root_op_type(rule) -> str | None:
    """The op type of the node an onnxscript ``RewriteRule``'s pattern ends at (the node ``try_rewrite`` is
    handed; the first output node of a multi-output pattern), or None when the pattern leaves it open.
    Reads ``RewriteRule._target_pattern.output_nodes[0]``: its ``op_identifier()``, or where that is None
    (the variants ``commute=True`` clones, whose op is kept as a ``StringConstantPattern``; half the
    variants in our library) its ``op`` pattern's fixed value. A node of another op type fails that rule's
    match at its first check (``NodePattern.matches`` compares the op type before anything), so the driver
    need not try it."""
    pattern = getattr(rule, "_target_pattern", None)
    nodes = getattr(pattern, "output_nodes", None)
    if not nodes:
        return None
    identifier = nodes[0].op_identifier()
    if identifier is not None:
        return identifier[1]
    op = getattr(nodes[0], "op", None)
    return op.value() if isinstance(op, StringConstantPattern) else None


def rule_op_types(rule) -> frozenset[str]:
    """The op types every match of an onnxscript ``RewriteRule`` holds a node of: those of the pattern's nodes
    reached from its outputs through node outputs alone, whose op is fixed (as ``rule_root_op_type`` reads
    it). Reads ``RewriteRule._target_pattern.outputs`` and walks them as ``_pattern_ir._nodes_in_pattern``
    does: an ``OrValue``'s alternatives (a ``Div`` or a ``Reciprocal``) are not on that walk, as a match needs
    only one of them; the pattern's own node list holds them all. A graph without one of the op types listed
    cannot match the rule anywhere."""
    pattern = getattr(rule, "_target_pattern", None)
    found: set[str] = set()
    seen: set[int] = set()
    pending = list(pattern.outputs) if pattern is not None else []
    while pending:
        value = pending.pop()
        if not isinstance(value, NodeOutputPattern):
            continue  # a variable, a constant, or alternatives: nothing every match holds
        node = value.producer()
        if id(node) in seen:
            continue
        seen.add(id(node))
        identifier = node.op_identifier()
        if identifier is not None:
            found.add(identifier[1])
        elif isinstance(node.op, StringConstantPattern):
            found.add(node.op.value())
        pending.extend(node.inputs)
    return frozenset(found)


def _shape_known(value: ir.Value) -> bool:
    """A type, and a shape whose every dim is a number or a named symbol (``unk__N``: ONNX's "don't know")."""
    shape = value.shape
    return (
        value.type is not None
        and shape is not None
        and all(
            isinstance(dim, int) or (dim.value is not None and not str(dim.value).startswith("unk__")) for dim in shape
        )
    )


class KnownShapesFoldConstantsPass(_constant_folding.FoldConstantsPass):
    """onnxscript's constant folder (``fold_constants(onnx_shape_inference=True)``) whose incremental ONNX shape
    inference skips a node whose outputs all have a type and a known shape (``_shape_known``). Overrides
    ``FoldConstantsPass._do_inference(node)``, which infers one node's outputs and merges the answer into
    shapes already there: where every dim is known it has nothing to add. The generic passes run the folder up
    to 8 sweeps over a graph the Shape Tracker has already inferred; most of the per-node inference (serialising
    the node and its input types for ``onnx.shape_inference.infer_node_outputs``) repeated what was known."""

    def _do_inference(self, node: ir.Node) -> None:
        if node.outputs and all(_shape_known(value) for value in node.outputs):
            return
        asked = self._inference_question(node)
        if asked is not None and _ANSWERED.get(node) == asked:
            return  # the same question as last time, and the outputs still hold that answer
        super()._do_inference(node)
        if asked is not None:
            _ANSWERED[node] = self._inference_question(node)

    def _inference_question(self, node: ir.Node) -> tuple | None:
        """What ``_do_inference`` hands ONNX for ``node``: its op and opset, its attributes, each input's name,
        type, shape and values where it passes them (a constant of up to 20 elements); and its outputs' names,
        types and shapes. None for a node with a subgraph or a tensor attribute, which this does not compare.

        The answer depends on nothing else, and merging it into outputs that already hold it changes nothing
        (``_merge_shapes`` keeps a known dim and takes a known one over a symbol): where this tuple is what it
        was after the last answer, the inference is skipped. A dynamic CNN's convolutions keep ``unk__`` dims
        that ONNX cannot size, and every sweep of the folder asked again (PP-OCRv4 cls: 1,661 asks for 168
        nodes). Values, not objects: nothing here keeps a value or a tensor of the graph alive."""
        asked: list = [node.op_type, node.domain, self._opset_imports.get(node.domain)]
        for name, attr in node.attributes.items():
            if attr.type not in _COMPARED_ATTRIBUTES:
                return None
            asked.append((name, attr.type, attr.value))
        for value in (*node.inputs, None, *node.outputs):
            if value is None:
                asked.append(None)
                continue
            tensor, values = value.const_value, None
            if tensor is not None and tensor.size <= _INFERENCE_CONSTANT_ELEMENTS:
                array = tensor.numpy()
                values = (array.dtype.str, array.shape, array.tobytes() if array.dtype != object else tuple(array.flat))
            dims = None if value.shape is None else tuple(value.shape.dims)
            asked.append((value.name, value.type, dims, values))
        return tuple(asked)


# The largest constant input whose values onnxscript's folder hands ONNX's node inference (its ``size_limit``).
_INFERENCE_CONSTANT_ELEMENTS = 20
_COMPARED_ATTRIBUTES = frozenset({
    ir.AttributeType.INT, ir.AttributeType.FLOAT, ir.AttributeType.STRING,
    ir.AttributeType.INTS, ir.AttributeType.FLOATS, ir.AttributeType.STRINGS,
})  # fmt: skip
# Node -> the question its last inference answered, with its outputs as that answer left them
# (``_inference_question``); an entry goes with its node.
_ANSWERED: weakref.WeakKeyDictionary[ir.Node, tuple] = weakref.WeakKeyDictionary()


def fold_known_shapes(model: ir.Model, should_fold: Callable[[ir.Node], bool | None]) -> bool:
    """``fold_constants(model, onnx_shape_inference=True, should_fold=...)`` with onnxscript's default size
    limits, inferring again only the nodes whose outputs are not all known (``KnownShapesFoldConstantsPass``).
    True if it changed the model."""
    return KnownShapesFoldConstantsPass(
        shape_inference=True,
        input_size_limit=_constant_folding.DEFAULT_CONSTANT_FOLD_INPUT_SIZE_LIMIT,
        output_size_limit=_constant_folding.DEFAULT_CONSTANT_FOLD_OUTPUT_SIZE_LIMIT,
        should_fold=should_fold,
    )(model).modified


def sympy_expression(dim: ir.SymbolicDim):
    """onnx_ir's own sympy parse of a symbolic dim's name (``16*batch``), without evaluating the model's
    strings; None when the dim is unnamed."""
    return dim._expr


def onnx_tensors(proto: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    """Every TensorProto of a model proto: initializers of every graph, and tensors in node attributes."""
    return onnx.external_data_helper._get_all_tensors(proto)


# -- onnxruntime ------------------------------------------------------------------------------------


def ort_kernels(provider: str) -> frozenset[tuple[str, str]]:
    """(op type, domain) of every kernel the installed onnxruntime registers for ``provider``, from its
    kernel registry (``get_all_opkernel_def``: onnxruntime's own op-documentation tool reads the same)."""
    from onnxruntime.capi import _pybind_state

    return frozenset(
        (kernel.op_name, kernel.domain)
        for kernel in _pybind_state.get_all_opkernel_def()
        if kernel.provider == provider
    )


@functools.cache
def _symbolic_shape_inference_class():
    """ONNX Runtime's ``SymbolicShapeInference``, loaded from its own file: importing it the usual way runs
    ``onnxruntime.tools.__init__``, which imports torch whenever torch is installed (seconds, for nothing)."""
    import onnxruntime

    path = Path(onnxruntime.__file__).parent / "tools" / "symbolic_shape_infer.py"
    spec = importlib.util.spec_from_file_location("flexdsa_ort_symbolic_shape_infer", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.sympy = _RememberingSympy()
    return module.SymbolicShapeInference


def preload_symbolic_shapes() -> None:
    """Import what ONNX Runtime's symbolic shape inference imports on its first use: its module (loaded from
    its own file), ``sympy.physics.units``, which sympy's ``simplify`` imports inside its first call (0.1 s),
    and the assumptions its comparisons import. For a process's entry point, before a job: see
    ``optimizer.preload``."""
    import sympy.assumptions.wrapper  # noqa: F401
    import sympy.physics.units  # noqa: F401

    _symbolic_shape_inference_class()


class _RememberingSympy:
    """``sympy`` as the shape inference's module sees it, with ``simplify`` remembered per expression.

    Its ``Resize`` rule simplifies ``floor(d * scale)`` for every output dim on every pass, and a detector's
    dims are deep nests of floors (``floor(2.0*floor(floor(h/2 - 1/2)/2)) + 2``): ppocr_det made 72 calls for
    13 distinct expressions, 4.6 s of its 4.9 s of shape inference. Expressions are immutable and compare
    by structure and assumptions, so an answer remembered is the answer sympy would give again. Where every
    float in the expression is whole (a Resize at scale 2), the answer is exact without sympy's search
    (``_integral_floats_exact``); the memory serves the rest, for one inference (``ort_symbolic_shapes``)."""

    def __getattr__(self, name: str):
        import sympy

        return getattr(sympy, name)

    @staticmethod
    @functools.lru_cache(maxsize=4096, typed=True)  # typed: simplify(2) is Integer(2), simplify(2.0) Float(2.0)
    def simplify(expression, *args, **kwargs):
        import sympy

        exact = _integral_floats_exact(expression)
        return exact if exact is not None else sympy.simplify(expression, *args, **kwargs)


def _integral_floats_exact(expression):
    """``expression`` with its whole-number floats made integers, where it has floats and all are whole:
    an equal expression that sympy's own evaluation then simplifies (``floor(2.0*floor(h/2))`` is
    ``2*floor(h/2)``: the floor of an integer). None where there is no float or one is not whole (then
    ``sympy.simplify`` decides). On Resize's ``floor(d * scale)`` at a whole scale, what ``sympy.simplify``
    spent 0.1-0.8 s each on and returned unchanged, float and all (PP-OCRv4 det: 11 such dims, 5 s of its
    shape inference); the exact form also names the output as its input (``floor(1.0*h)`` is ``h``)."""
    import sympy

    if not isinstance(expression, sympy.Basic):
        return None
    floats = expression.atoms(sympy.Float)
    if not floats or not all(float(f).is_integer() for f in floats):
        return None
    return expression.xreplace({f: sympy.Integer(int(f)) for f in floats})


def ort_symbolic_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """ONNX Runtime's symbolic shape inference of ``model`` (``auto_merge`` on, guessing off), as far as
    it gets: the returned proto carries the shapes it found in ``value_info`` and the graph outputs.

    Driven step by step (``_preprocess``, ``_infer_impl`` while ``run_``, ``_update_output_from_vi``,
    ``out_mp_``) rather than through ``infer_shapes()``, which on an incomplete result writes a temporary
    model into the working directory; a partial answer is still useful to us. Raises what it raises on
    an op it has no rule for.

    What ``simplify`` remembered on the way (``_RememberingSympy``) is let go when it returns: it serves
    the passes of one inference only. So is what printing and sympy's own recursive ``simplify`` remembered
    (``_remembered_printing``, ``_remembered_simplify``)."""
    inference = _symbolic_shape_inference_class()(2**31 - 1, True, False, 0)
    try:
        with _remembered_printing(), _remembered_simplify():
            inference._preprocess(model)
            while inference.run_:
                inference._infer_impl()
            inference._update_output_from_vi()
        return inference.out_mp_
    finally:
        del inference
        _forget_symbolic_work()


_PRINTING = threading.Lock()


@contextlib.contextmanager
def _remembered_printing():
    """Inside, ``str()`` of a sympy expression is worked out once per expression object.

    The shape inference names dims by printing them: every pass prints every symbolic dim of every node
    again (``_update_computed_dims``, ``get_shape_from_sympy_shape``), and sympy prints an expression by
    walking it each time. PP-OCRv4 det printed 34 expression objects 4,165 times, most of its 2.4 s of
    shape inference. An expression is immutable, so its text is too; it is remembered by identity (the
    object is held beside its text, so its ``id`` is not reused), which cannot answer one expression with
    another's text. Only sympy's own printing hook changes, for the inference's duration (one at a time in
    a process: the hook is the class's); the inference's own ``str`` stays the builtin, which its
    ``type(d) is str`` checks need."""
    from sympy.core._print_helpers import Printable

    with _PRINTING:
        plain = Printable.__str__
        said: dict[int, tuple[object, str]] = {}

        def remembered(expression) -> str:
            known = said.get(id(expression))
            if known is None or known[0] is not expression:
                known = said[id(expression)] = (expression, plain(expression))
            return known[1]

        Printable.__str__ = remembered
        try:
            yield
        finally:
            Printable.__str__ = plain


_SIMPLIFYING = threading.Lock()


@contextlib.contextmanager
def _remembered_simplify():
    """Inside, sympy's ``simplify`` answers the parts of an expression it has simplified already from memory.

    ``simplify`` first simplifies the arguments of every function in the expression, calling itself on each
    (its module's global ``simplify``), and each of those calls does the same for the functions below it:
    a nest of floors, which every strided convolution on a symbolic dim adds one level to, is simplified
    again from the bottom at every level (a four-conv CNN's TorchScript export: 78 calls under 4, most of its
    1 s of shape inference, every answer the expression unchanged). Here that global answers an expression it
    was asked before, with the same options, with sympy's own answer of then: expressions are immutable and
    compare by structure and assumptions, and the type is part of the key (``2`` and ``2.0`` are equal
    in Python, not to sympy), so the answer is the one sympy would give again. Put back afterwards, on
    errors too; one inference at a time in a process, as the global is the module's."""
    module = importlib.import_module("sympy.simplify.simplify")  # ``sympy.simplify`` names the function
    with _SIMPLIFYING:
        plain = module.simplify
        answers: dict[tuple, object] = {}

        def remembered(expression, *args, **kwargs):
            key = (type(expression), expression, args, tuple(sorted(kwargs.items())))
            try:
                answer = answers.get(key, answers)  # ``answers`` itself: not asked before
            except TypeError:  # an argument that cannot be a key: sympy decides afresh
                return plain(expression, *args, **kwargs)
            if answer is answers:
                answer = answers[key] = plain(expression, *args, **kwargs)
            return answer

        module.simplify = remembered
        try:
            yield
        finally:
            module.simplify = plain


def _forget_symbolic_work() -> None:
    """Drop ``_RememberingSympy``'s answers, which serve one inference. sympy's own caches
    (``sympy.core.cache``) stay: every later sympy call of the job reads them."""
    _RememberingSympy.simplify.cache_clear()
