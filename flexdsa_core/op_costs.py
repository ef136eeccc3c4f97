"""Work per op: FLOPs and bytes moved by one kernel, from its shapes, dtypes and attributes.

One short function per op in a decorator registry (``@op_cost("MatMul")``), each returning a ``Cost``
(``cost.py``), a small frozen value that adds up. An op nobody registered costs one operation per output element and moves
every input and output once. Turning work into seconds and joules (a roofline from the target's spec, or a
measurement on this machine) is the cost model's job (``cost_model.py``). The formulas:

* MatMul ``[..., M, K] x [..., K, N]``: ``2 M N K`` per batch; Gemm adds ``M N`` for the bias and the
  fused activation's operations per output element.
* Conv (weights ``[M, C/group, k...]``): ``2 * out_elems * (C/group) * prod(k)``, plus one per output for
  the bias, the fused residual and the activation; ConvTranspose scatters from each input element.
* Pools: ``prod(kernel)`` per output element; reductions: one operation per element read; elementwise and
  normalisation ops: a fixed count per output element (data movement: 0, only bytes).
* Attention: per batch and head ``2 S L d`` (Q K^T) + ``5 S L`` (softmax) + ``2 S L dv`` (P V), plus the
  QKV projection ``2 B S H 3H`` where the op holds it (``com.microsoft::Attention``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from flexdsa_core.cost import Cost
from flexdsa_core.targets.spec import op_key


@dataclass(frozen=True)
class TensorInfo:
    """One input or output of a node, with every dim concrete."""

    shape: tuple[int, ...]
    dtype: str  # numpy name: 'float32', 'int64'...
    const: bool = False
    value: np.ndarray | None = field(default=None, compare=False)  # small integer constants only

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * np.dtype(self.dtype).itemsize


@dataclass(frozen=True)
class OpView:
    """What a cost function sees of a node: op, attributes, and concrete inputs/outputs (None = absent)."""

    op_type: str
    domain: str
    attrs: Mapping[str, object]
    inputs: tuple[TensorInfo | None, ...]
    outputs: tuple[TensorInfo | None, ...]

    def attr(self, name: str, default=None):
        return self.attrs.get(name, default)

    def input(self, index: int) -> TensorInfo | None:
        return self.inputs[index] if index < len(self.inputs) else None

    @property
    def out_elems(self) -> int:
        return sum(t.numel for t in self.outputs if t is not None)

    @property
    def io_bytes(self) -> int:
        return sum(t.nbytes for t in (*self.inputs, *self.outputs) if t is not None)


# ---------------------------------------------------------------------------------------------------
# Per-op work: one short function per op.

_OP_COSTS: dict[str, Callable[[OpView], Cost]] = {}


def op_cost(*keys: str):
    """Register the work function of one or more ops (``'MatMul'``, ``'com.microsoft::FusedConv'``)."""

    def register(function: Callable[[OpView], Cost]):
        for key in keys:
            _OP_COSTS[key] = function
        return function

    return register


def work(view: OpView) -> Cost:
    """FLOPs and bytes of one node (seconds/joules not filled in)."""
    function = _OP_COSTS.get(op_key(view.op_type, view.domain), _elementwise)
    try:
        return function(view)
    except (TypeError, IndexError, ValueError, ZeroDivisionError, AttributeError):
        # A formula fed shapes it did not expect (missing optional input, odd rank): count it as
        # element-wise rather than fail the whole estimate.
        return _elementwise(view)


def _per_element(view: OpView, ops_per_element: float) -> Cost:
    return Cost(flops=ops_per_element * view.out_elems, bytes=view.io_bytes)


def _elementwise(view: OpView) -> Cost:
    return _per_element(view, 1)


def _per_element_op(ops: float, *keys: str) -> None:
    op_cost(*keys)(lambda view: _per_element(view, ops))


# Data movement and metadata: no arithmetic, only the bytes they copy.
_per_element_op(
    0, "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Transpose", "Concat", "Split", "Slice",
    "Gather", "GatherElements", "GatherND", "Expand", "Tile", "Pad", "Cast", "Shape", "Size", "Dropout",
    "DepthToSpace", "SpaceToDepth", "ScatterND", "ScatterElements", "ConstantOfShape", "Range",
)  # fmt: skip
_per_element_op(2, "PRelu", "com.microsoft::QuickGelu", "HardSigmoid", "Clip")
_per_element_op(3, "HardSwish")
_per_element_op(4, "Sigmoid", "Swish", "Silu", "Mish", "Softplus")
_per_element_op(8, "Gelu", "com.microsoft::Gelu")
_per_element_op(9, "com.microsoft::BiasGelu")
_per_element_op(10, "com.microsoft::FastGelu")
_per_element_op(5, "Softmax", "LogSoftmax")
_per_element_op(8, "LayerNormalization")
_per_element_op(5, "SimplifiedLayerNormalization", "RMSNormalization")
_per_element_op(10, "com.microsoft::SkipLayerNormalization")
_per_element_op(7, "com.microsoft::SkipSimplifiedLayerNormalization")
_per_element_op(2, "BatchNormalization", "InstanceNormalization", "GroupNormalization")


@op_cost("Constant")
def _constant(view: OpView) -> Cost:
    return Cost()  # folded into an initializer at session load: no kernel runs


@op_cost("MatMul", "MatMulInteger", "com.microsoft::FusedMatMul")
def _matmul(view: OpView) -> Cost:
    """[..., M, K] x [..., K, N]: 2*M*N*K per batch (a multiply and an add per term)."""
    a = view.inputs[0]
    trans_a = view.attr("transA", 0)
    k = a.shape[-2] if trans_a and len(a.shape) > 1 else a.shape[-1]
    return Cost(flops=2 * view.out_elems * k, bytes=view.io_bytes)


_ACTIVATION_OPS = {"Relu": 1, "LeakyRelu": 2, "Sigmoid": 4, "Tanh": 4, "HardSigmoid": 2, "Clip": 2}


def _activation_ops(view: OpView) -> int:
    return _ACTIVATION_OPS.get(str(view.attr("activation", "")), 1) if view.attr("activation") else 0


@op_cost("Gemm", "com.microsoft::FusedGemm")
def _gemm(view: OpView) -> Cost:
    """A (M,K) x B (K,N) [+ C] [then activation]: 2*M*N*K + M*N (bias) + M*N*activation."""
    a = view.inputs[0]
    k = a.shape[0] if view.attr("transA", 0) else a.shape[1]
    out = view.out_elems
    bias = out if view.input(2) is not None else 0
    return Cost(flops=2 * out * k + bias + out * _activation_ops(view), bytes=view.io_bytes)


@op_cost("Conv", "com.microsoft::FusedConv", "ConvInteger")
def _conv(view: OpView) -> Cost:
    """W is [M, C/group, k...]: each output element takes C/group * prod(k) multiply-adds, + bias,
    + the fused activation, + the fused residual Z."""
    weight = view.inputs[1]
    out = view.out_elems
    flops = 2 * out * math.prod(weight.shape[1:])
    flops += out if view.input(2) is not None else 0
    flops += out if view.input(3) is not None else 0
    flops += out * _activation_ops(view)
    return Cost(flops=flops, bytes=view.io_bytes)


@op_cost("ConvTranspose")
def _conv_transpose(view: OpView) -> Cost:
    """W is [C, M/group, k...]: each input element scatters M/group * prod(k) multiply-adds."""
    x, weight = view.inputs[0], view.inputs[1]
    flops = 2 * x.numel * math.prod(weight.shape[1:])
    return Cost(flops=flops + (view.out_elems if view.input(2) is not None else 0), bytes=view.io_bytes)


@op_cost("MaxPool", "AveragePool", "LpPool")
def _pool(view: OpView) -> Cost:
    kernel = view.attr("kernel_shape") or [1]
    return Cost(flops=view.out_elems * math.prod(kernel), bytes=view.io_bytes)


@op_cost(
    "GlobalAveragePool", "GlobalMaxPool", "ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd",
    "ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSumExp", "ArgMax", "ArgMin",
)  # fmt: skip
def _reduction(view: OpView) -> Cost:
    """One operation per element read."""
    return Cost(flops=view.inputs[0].numel, bytes=view.io_bytes)


def _attention_core(batch: int, heads: int, q_len: int, kv_len: int, head_size: int, v_head: int) -> float:
    """Q K^T (2*S*L*d), softmax (5 per score), P V (2*S*L*dv), per batch and head."""
    scores = batch * heads * q_len * kv_len
    return 2 * scores * head_size + 5 * scores + 2 * scores * v_head


@op_cost("com.microsoft::Attention")
def _ms_attention(view: OpView) -> Cost:
    """input [B,S,H] x weights [H, 3H] (the QKV projection), then attention over num_heads."""
    x, weights = view.inputs[0], view.inputs[1]
    batch, seq, hidden = x.shape
    projection = 2 * batch * seq * hidden * weights.shape[1]
    heads = int(view.attr("num_heads", 1))
    head_size = weights.shape[1] // 3 // heads
    core = _attention_core(batch, heads, seq, seq, head_size, head_size)
    return Cost(flops=projection + core, bytes=view.io_bytes)


@op_cost("com.microsoft::MultiHeadAttention")
def _ms_multi_head_attention(view: OpView) -> Cost:
    """query [B,S,D], key [B,L,D], value [B,L,Dv] (3-D form)."""
    query, key = view.inputs[0], view.input(1)
    heads = int(view.attr("num_heads", 1))
    batch, q_len, width = query.shape[0], query.shape[1], query.shape[-1]
    kv_len = key.shape[1] if key is not None and len(key.shape) == 3 else q_len
    head_size = width // heads
    return Cost(flops=_attention_core(batch, heads, q_len, kv_len, head_size, head_size), bytes=view.io_bytes)


@op_cost("Attention")
def _onnx_attention(view: OpView) -> Cost:
    """ai.onnx Attention (opset 23): Q [B, heads, S, d] or [B, S, heads*d]; K [.., L, d]; V [.., L, dv]."""
    query, key, value = view.inputs[0], view.inputs[1], view.inputs[2]
    if len(query.shape) == 4:
        batch, heads, q_len, head_size = query.shape
        kv_len, v_head = key.shape[2], value.shape[3]
    else:
        heads = int(view.attr("q_num_heads", 1))
        batch, q_len = query.shape[0], query.shape[1]
        head_size = query.shape[2] // heads
        kv_len, v_head = key.shape[1], value.shape[2] // int(view.attr("kv_num_heads", heads))
    return Cost(flops=_attention_core(batch, heads, q_len, kv_len, head_size, v_head), bytes=view.io_bytes)
