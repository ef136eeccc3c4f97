#!/usr/bin/env bash
# ATC conversion of this bundle for Ascend 310B: one offline model (.om) per shape bucket.
# Needs the CANN toolkit's atc on PATH (source <ascend-toolkit>/set_env.sh first).
set -euo pipefail
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
{% for bucket in buckets %}
{% if bucket.symbolic %}
# bucket {{ bucket.name|comment }}: dims {{ bucket.symbolic|join(", ")|comment }} are not fixed; ATC needs them fixed
{% endif %}
# bucket {{ bucket.name|comment }}
atc \
    --model={{ bucket.onnx }} \
    --framework=5 \
    --soc_version="${SOC_VERSION}" \
    --input_format={{ bucket.input_format }} \
    --input_shape={{ bucket.input_shape }} \
    --output={{ bucket.output }} \
{% if switches %}
    ${PRECISION_MODE:+--precision_mode="${PRECISION_MODE}"} \
    --fusion_switch_file=fusion_switch.cfg
{% else %}
    ${PRECISION_MODE:+--precision_mode="${PRECISION_MODE}"}
{% endif %}
{% endfor %}
