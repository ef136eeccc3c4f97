#!/usr/bin/env bash
# ATC conversion into ONE offline model with a --dynamic_dims gear per shape bucket (H8, H24).
# Needs the CANN toolkit's atc on PATH (source <ascend-toolkit>/set_env.sh first).
set -euo pipefail
MODEL="${1:?usage: atc_dynamic_dims.sh MODEL.onnx (the model with symbolic dims)}"
MODEL="$(cd "$(dirname "${MODEL}")" && pwd)/$(basename "${MODEL}")"
cd "$(dirname "$0")"
{# Assignments take no "...": an assignment is never split, and a value the renderer quotes would keep its quotes inside "...". #}
SOC_VERSION=${SOC_VERSION:-{{ soc_version }}}
# Requested precision: {{ precision|comment }}. Empty PRECISION_MODE keeps ATC's default policy; set it to e.g.
# allow_fp32_to_fp16, force_fp16, force_fp32, must_keep_origin_dtype or allow_mix_precision.
PRECISION_MODE=${PRECISION_MODE-{{ precision_mode }}}
{% if switches %}
# fusion_switch.cfg switches these GE fusion passes off (--fusion_switch_file, H10, H11):
{% for name, why in switches.items() %}
#   {{ name|comment }}: {{ why|comment }}
{% endfor %}
{% else %}
# No GE fusion pass is switched off: every graph and UB fusion stays on (H10).
{% endif %}
# The per-bucket ONNX files are specialised to their shapes (folded shape arithmetic), so gears need
# a model whose dims are still symbolic, in ai.onnx opset 11-15: MODEL, the first argument.
# --dynamic_dims excludes AIPP (--insert_op_conf) and the other dynamic options (H8); AMCT INT8 models
# cannot use it (H9); networks with data-dependent intermediate shapes are not supported (H24).
{% if many_dims %}
# Note: more than 4 dynamic dims per gear; older CANN versions accept at most 4 (H24).
{% endif %}
{% if data_dependent %}
# Warning: the model has data-dependent shapes (NonZero/NMS/...); ATC may refuse gears (H24).
{% endif %}
atc \
    --model="${MODEL}" \
    --framework=5 \
    --soc_version="${SOC_VERSION}" \
    --input_format=ND \
    --input_shape={{ input_shape }} \
    --dynamic_dims={{ gears|join(";") }} \
    --output=model.dynamic_dims \
{% if switches %}
    ${PRECISION_MODE:+--precision_mode="${PRECISION_MODE}"} \
    --fusion_switch_file=fusion_switch.cfg
{% else %}
    ${PRECISION_MODE:+--precision_mode="${PRECISION_MODE}"}
{% endif %}
