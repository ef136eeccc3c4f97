"""Precision, after the fp32 pipeline: int8 and mixed on cpu-ort, fp16 on accelerators, judged by accuracy.

Accuracy (``AccuracyTarget``, scored by ``accuracy.score``: per output its task's metric, cosine, top-1 or
per-slice) is judged against the fp32 original on samples the quantiser did not calibrate on: the samples
are split (``holdout.plan``; k-fold when few; whole groups when the calibration file names each sample's
source), every quantiser calibrates on one part (``run.calibration``)
and every decision is taken on the other (``run.judged``); the candidate about to ship is confirmed on every
fold (``_confirm``). A model below the target on the held-out samples is never shipped, whatever it scored on
its calibration samples (both figures are reported). Synthetic samples check numerics only and say so.

**int8 on cpu-ort.** Candidates, each made from our fused fp32 model:

* ``static_qdq``: ``onnxruntime.quantization.quantize_static`` (QDQ, MinMax calibration on the samples),
  u8 activations and s8 per-channel weights, the format ONNX Runtime's x86 int8 kernels take. Without an
  int8 dot-product instruction (AVX-512 VNNI, AVX-VNNI, AMX) the u8 x s8 kernels sum pairs of products in
  16 bits (``vpmaddubsw``) and can saturate: there weights get 7 bits (``reduce_range``); with one, 8.
* ``static_qdq_unfused``: the same, on the model compiled without our fusions whose com.microsoft ops hold
  weights (``QDQ_OPAQUE_WEIGHT_OPS``: the QDQ quantiser knows no com.microsoft op and leaves them, weights
  and all, in float; ONNX Runtime fuses the QDQ graph itself at ORT_ENABLE_ALL). Our other fusions
  (GELU, SkipLayerNorm, MultiHeadAttention...) stay. Which order is faster is measured, not assumed.
* ``dynamic``: ``quantize_dynamic``, s8 per-tensor weights, activations quantised per run, of MatMuls only, in
  the form ONNX Runtime's ``DynamicQuantizeMatMul`` takes (``cpu_forms``: our Attention back to a projection
  MatMul + MultiHeadAttention, a tied-weight FusedMatMul to a MatMul with a transposed constant weight).
* ``static_qdq_costed``: the static model of the graph that quantises more layers, with the ops measured
  slower in int8 than in fp32 on this CPU kept float (``costing``: profiled, interleaved, paired). The
  per-op figures are kept in the kernel cache (``cache``): a compile whose ops were all measured before
  on this machine, in this format, does not profile again; ``layers[].timing_source`` says which were.
* ``static_qdq_weights``: only the weight layers (Conv, MatMul, Gemm with initializer weights) in int8;
  residual Adds, LayerNorm, Softmax and attention-score MatMuls float (ViT's residual stream does not fit
  one per-tensor int8 scale: ONNX Runtime's static QDQ of every op keeps a cosine of 0.33 there).

Where the all-int8 model misses the target, it is made again: calibrated by ONNX Runtime's Percentile and
Entropy methods (``static_qdq_percentile``, ``static_qdq_entropy``: the best of the three calibrates the later
candidates), with each Conv's bias corrected by the mean error its output carries (``..._bias_corrected``),
and from the model after cross-layer equalisation (``static_qdq[_method]_cle`` and its bias-corrected form;
``equalise``: consecutive layers' channel ranges balanced by power-of-two scales through positive-homogeneous
ops, so the fp32 model's outputs are bit-identical, checked on the held-out samples before it is used).

Each is scored, then timed with the fp32 model (and the original) in interleaved paired rounds
(``significance.paired``); the fastest that meets the target and is not significantly slower than fp32
ships (the never-slower guard), else fp32 or a failure naming the most sensitive layers, as asked.

**mixed** (cpu-ort). Sensitivity of a layer (a node with quantised weights) = the accuracy it alone costs:
the model with only that layer quantised, ``1 - min over outputs of min(cosine, top-1 agreement)`` (top-1 by
the accuracy target's rule: confident rows, or labels; ties broken over every row, ``sensitivity_order``). Then the
``k`` most sensitive weight layers stay float for the smallest ``k`` whose static model meets the target,
found by bisection over ``k`` (ops measured slower in int8 are float throughout; when every other op in
int8 misses the target, only weight layers are quantised); then the kept-float layers with the largest
measured int8 gain are tried back one at a time. The calibration ranges are computed once and reused.
Where dynamic int8 of every MatMul misses the target, ``dynamic_mixed`` keeps the most sensitive of them float
in dynamic int8, by the same ranking: the one most sensitive, then the fewest found by bisection.

**A classifier head** (a MatMul with a constant [D, V] weight, V >= 2048, writing a top-1-judged output: an
LM head) gets its top 8 candidates per row re-scored exactly in fp32 after int8 (``cpu_forms.exact_top_k``):
its top-1 is then the fp32 head's, and the int8 GEMM still does the bulk. ``dynamic_exact_head`` (dynamic
int8 of every MatMul so) is a candidate where plain ``dynamic`` misses the target; ``dynamic_mixed`` keeps
such a head int8 and ranks only the other MatMuls.

**fp16** (accelerators): float16 weights and arithmetic (ONNX Runtime's float16 converter, keeping float32
graph inputs/outputs under ``keep_io_types``), checked element-wise with the float16 tolerances and by the
accuracy target.

The package, one module per part (each imports only those listed before it):

* ``formats``: what a request may ask of a target, and the int8 form each target takes (vendor formats).
* ``cpu_forms``: our fused ops rewritten into the forms ONNX Runtime's int8 kernels take; ``exact_top_k``.
* ``costing`` and ``cache``: per-op int8 against fp32 on this CPU, kept in the kernel cache.
* ``scoring``: ``PrecisionRun``, accuracy on held-out samples, timing against fp32, the pick.
* ``quantise``: ONNX Runtime's static QDQ and dynamic quantisers over our model.
* ``bias_correction`` and ``equalise``: exact or mean-preserving rewrites around the quantiser.
* ``mixed``: sensitivity and the searches for the layers that stay float.
* ``int8``: the cpu-ort int8/mixed candidates, built and chosen.
* ``vendor``: the layers a vendor's quantiser keeps float, and its verdict; ``fp16``: float16.
* ``apply``: ``apply_precision``, the stage's entry.
"""

from flexdsa_core.accuracy import score
from flexdsa_core.precision.apply import apply_precision, replace_model, samples_dataset, samples_npz
from flexdsa_core.precision.formats import (
    check_calibration_source,
    check_precision_request,
    cpu_int8_features,
    int8_format,
    int8_only,
    synthetic_calibration_warning,
)
from flexdsa_core.precision.quantise import QDQ_OPAQUE_WEIGHT_OPS
from flexdsa_core.precision.scoring import PrecisionRun, packed_tails
from flexdsa_core.precision.vendor import vendor_verdict
from flexdsa_core.targets.int8_format import Int8Format

__all__ = [
    "QDQ_OPAQUE_WEIGHT_OPS", "Int8Format", "PrecisionRun", "apply_precision", "check_calibration_source",
    "check_precision_request", "cpu_int8_features", "int8_format", "int8_only", "packed_tails", "replace_model",
    "samples_dataset", "samples_npz", "score", "synthetic_calibration_warning", "vendor_verdict",
]  # fmt: skip
