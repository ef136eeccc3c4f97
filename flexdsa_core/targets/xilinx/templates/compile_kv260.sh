#!/usr/bin/env bash
# Quantise and compile this bundle for the KV260 DPU (DPUCZDX8G B4096), one xmodel per shape bucket.
# Run inside the Vitis AI docker (vai_c_xir on PATH, the arch.json below present).
#   bash compile_kv260.sh ds.txt    # ds.txt: one calibration sample a line, one .npy per input
set -euo pipefail
DATASET="${1:?usage: compile_kv260.sh DATASET.txt (one calibration sample a line)}"
DATASET="$(cd "$(dirname "${DATASET}")" && pwd)/$(basename "${DATASET}")"
cd "$(dirname "$0")"
{# Assignments take no "...": an assignment is never split, and a value the renderer quotes would keep its quotes inside "...". #}
ARCH=${ARCH:-{{ arch }}}  # the board's DPU fingerprint: recompile when it changes (X5)
QUANTIZER="${QUANTIZER:-quark}"  # or vai_q_onnx

# 1. Power-of-two int8, per tensor: the only scheme the DPU runs (X8). Writes model.<bucket>.qdq.onnx.
python3 quantize_kv260.py --dataset "${DATASET}" --quantizer "${QUANTIZER}"

# 2. vai_c_xir per bucket (X10). It reads the quantiser's xmodel: XMODEL_DIR/<net>_int.xmodel, as the
# Vitis AI quantiser exports it from the quantised model. On Vitis AI 3.5 the QDQ ONNX can instead run
# through ONNX Runtime's Vitis AI EP on the board (A11), which compiles it for the DPU itself.
XMODEL_DIR="${XMODEL_DIR:-quantized}"
{% for bucket in buckets %}
# bucket {{ bucket.name|comment }}
XMODEL="${XMODEL_DIR}"/{{ bucket.net ~ "_int.xmodel" }}
if [ -f "${XMODEL}" ]; then
  vai_c_xir \
    -x "${XMODEL}" \
    -a "${ARCH}" \
    -o {{ "compiled/" ~ bucket.name }} \
    -n {{ bucket.net }}
else
  printf 'bucket %s: %s not found in %s; export it from %s with your Vitis AI quantiser, or run the QDQ ONNX through the Vitis AI EP on the board\n' \
    {{ bucket.name }} {{ bucket.net ~ "_int.xmodel" }} "${XMODEL_DIR}" {{ bucket.qdq }} >&2
fi
{% endfor %}
