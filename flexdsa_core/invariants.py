"""Graph invariants checked between stages (under ``options.debug_invariants``).

After every stage the graph must still be a well-formed program:

* nodes are in topological order (in every subgraph too);
* every value has exactly one producer: no two values share a name, and a value's producer lists it;
* nothing dangles: each node input is a graph input, an initializer, or some node's output in scope;
* recorded shapes and types agree with what ONNX shape inference derives for each node, where both
  are known (a static dim that disagrees means a rewrite changed what a value holds);
* when the caller gives ``supported(op_type, domain)`` (the order of ``PlatformAdapter.supports``), every op (Constant aside: data,
  not a kernel) is one the target supports.

A violation is a compiler bug, never the user's fault: ``InvariantError`` names the stage that broke it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import onnx
import onnx_ir as ir

from flexdsa_core.errors import FlexDSAError

_MAX_REPORTED = 10
_INFERENCE_CONSTANT_ELEMENTS = 64


class InvariantError(FlexDSAError):
    """A stage left the graph malformed: a compiler bug. The message names the stage."""

    code = "invariant_violated"
    http_status = 500


def check_invariants(
    model: ir.Model, *, stage: str, supported: Callable[[str, str], bool] | None = None
) -> None:
    problems: list[str] = []
    graphs = list(_graphs(model.graph))
    provided = _provided_values(graphs)
    for graph in graphs:
        problems += _order_problems(graph)
        problems += _producer_problems(graph)
        problems += [
            f"node '{_label(node)}' reads '{value.name}', which nothing provides"
            for node, value in dangling_inputs(graph, provided)
        ]
    problems += _shape_problems(model, graphs)
    if supported is not None:
        problems += _support_problems(graphs, supported)
    if problems:
        shown = "; ".join(problems[:_MAX_REPORTED])
        more = f" (and {len(problems) - _MAX_REPORTED} more)" if len(problems) > _MAX_REPORTED else ""
        raise InvariantError(
            f"Stage '{stage}' left the graph malformed: {shown}{more}. This is a compiler bug: switch off "
            "the stage's rewrites (disabled_rules) to get past it, and report the model.",
            details={"stage": stage, "problems": problems},
        )


def _label(node: ir.Node) -> str:
    return node.name or f"{node.op_type}#{id(node):x}"


def _graphs(graph: ir.Graph) -> Iterator[ir.Graph]:
    yield graph
    for node in graph:
        for attr in node.attributes.values():
            if attr.is_ref():
                continue
            if attr.type == ir.AttributeType.GRAPH:
                yield from _graphs(attr.value)
            elif attr.type == ir.AttributeType.GRAPHS:
                for subgraph in attr.value:
                    yield from _graphs(subgraph)


def _provided_values(graphs: list[ir.Graph]) -> set[int]:
    provided: set[int] = set()
    for graph in graphs:
        provided.update(id(value) for value in graph.inputs)
        provided.update(id(value) for value in graph.initializers.values())
        for node in graph:
            provided.update(id(value) for value in node.outputs)
    return provided


def dangling_inputs(graph: ir.Graph, provided: set[int] | None = None) -> list[tuple[ir.Node, ir.Value]]:
    """(node, value) pairs where ``node`` in ``graph`` reads a value nothing provides."""
    if provided is None:
        provided = _provided_values(list(_graphs(graph)))
    return [
        (node, value)
        for node in graph
        for value in node.inputs
        if value is not None and id(value) not in provided
    ]


def _order_problems(graph: ir.Graph) -> list[str]:
    seen: set[int] = set()
    problems = []
    for node in graph:
        for value in node.inputs:
            producer = value.producer() if value is not None else None
            if producer is not None and producer.graph is graph and id(producer) not in seen:
                problems.append(
                    f"node '{_label(node)}' comes before '{_label(producer)}', which produces its input"
                )
        seen.add(id(node))
    return problems


def _producer_problems(graph: ir.Graph) -> list[str]:
    problems = []
    owner: dict[str, str] = {}

    def claim(name: str | None, by: str) -> None:
        if not name:
            return
        if name in owner and owner[name] != by:
            problems.append(f"value name '{name}' is produced twice ({owner[name]} and {by})")
        owner[name] = by

    for value in graph.inputs:
        claim(value.name, "a graph input")
    for name, value in graph.initializers.items():
        if not value.is_graph_input():
            claim(name, "an initializer")
    for node in graph:
        for value in node.outputs:
            if value.producer() is not node:
                problems.append(
                    f"'{value.name}' is listed as an output of '{_label(node)}' but has another producer"
                )
            claim(value.name, f"node '{_label(node)}'")
    for value in graph.outputs:
        if value.producer() is None and not value.is_graph_input() and not value.is_initializer():
            problems.append(f"graph output '{value.name}' has no producer")
    return problems


def _support_problems(graphs: list[ir.Graph], supported: Callable[[str, str], bool]) -> list[str]:
    missing: dict[tuple[str, str], int] = {}
    for graph in graphs:
        for node in graph:
            if node.op_type == "Constant" and node.domain == "":
                continue  # data, not an op the target executes
            if not supported(node.op_type, node.domain):
                key = (node.domain, node.op_type)
                missing[key] = missing.get(key, 0) + 1
    return [
        f"op '{(domain + '::') if domain else ''}{op_type}' ({count} node(s)) is not supported by the target"
        for (domain, op_type), count in sorted(missing.items())
    ]


def _shape_problems(model: ir.Model, graphs: list[ir.Graph]) -> list[str]:
    problems = []
    opsets = model.opset_imports
    for graph in graphs:
        for node in graph:
            inferred = _infer(node, opsets)
            for value in node.outputs:
                type_proto = inferred.get(value.name) if value.name else None
                if type_proto is None:
                    continue
                problem = _compare(value, type_proto)
                if problem:
                    problems.append(f"'{value.name}' from node '{_label(node)}': {problem}")
    return problems


def _infer(node: ir.Node, opsets: dict[str, int]) -> dict[str, onnx.TypeProto]:
    """ONNX's per-node shape inference from the recorded input types; {} when it cannot run."""
    if node.domain not in ("", "ai.onnx", "ai.onnx.ml") or any(
        attr.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS) for attr in node.attributes.values()
    ):
        return {}
    input_types: dict[str, onnx.TypeProto] = {}
    input_data: dict[str, onnx.TensorProto] = {}
    for value in node.inputs:
        if value is None:
            continue
        if value.type is None or not value.name:
            return {}
        type_proto = ir.serde.serialize_type(value.type)
        if value.shape is not None:
            ir.serde.serialize_shape_into(type_proto, value.shape)
        input_types[value.name] = type_proto
        tensor = value.const_value
        if tensor is not None and tensor.size <= _INFERENCE_CONSTANT_ELEMENTS and not value.is_graph_input():
            input_data[value.name] = ir.serde.serialize_tensor(tensor)
    try:
        schema = onnx.defs.get_schema(node.op_type, opsets.get(node.domain, 1), node.domain)
        return onnx.shape_inference.infer_node_outputs(
            schema, ir.serde.serialize_node(node), input_types, input_data
        )
    except Exception:  # no schema, or inference itself rejects the node: nothing to compare
        return {}


def _compare(value: ir.Value, type_proto: onnx.TypeProto) -> str | None:
    if not type_proto.HasField("tensor_type"):
        return None
    tensor_type = type_proto.tensor_type
    if value.dtype is not None and tensor_type.elem_type and tensor_type.elem_type != value.dtype:
        return f"recorded type {value.dtype.name} but the node computes {ir.DataType(tensor_type.elem_type).name}"
    if value.shape is None or not tensor_type.HasField("shape"):
        return None
    inferred_dims = [dim.dim_value if dim.HasField("dim_value") else None for dim in tensor_type.shape.dim]
    if len(inferred_dims) != len(value.shape):
        return f"recorded rank {len(value.shape)} but the node computes rank {len(inferred_dims)}"
    for recorded, inferred in zip(value.shape.dims, inferred_dims, strict=True):
        if isinstance(recorded, int) and inferred is not None and recorded != inferred:
            return f"recorded shape {list(value.shape.dims)} but the node computes {inferred_dims}"
    return None
