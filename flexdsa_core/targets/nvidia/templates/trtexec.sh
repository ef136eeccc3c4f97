#!/usr/bin/env bash
# TensorRT engines for this bundle with trtexec, on the Jetson Orin Nano (engines are specific to the
# device and the TensorRT version). JetPack installs trtexec under /usr/src/tensorrt/bin.
#   bash trtexec.sh            one engine per shape bucket (static ONNX, no profile needed)
#   bash trtexec.sh MODEL.onnx one engine for all buckets from a model whose dims are symbolic,
#                              with the min/opt/max profile below (opt = the first bucket)
set -euo pipefail
DYNAMIC_MODEL=""
if [ "$#" -ge 1 ]; then DYNAMIC_MODEL="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"; fi
cd "$(dirname "$0")"
TRTEXEC="${TRTEXEC:-$(command -v trtexec || echo /usr/src/tensorrt/bin/trtexec)}"
{# Assignments take no "...": an assignment is never split, and a value the renderer quotes would keep its quotes inside "...". #}
WORKSPACE_MIB=${WORKSPACE_MIB:-{{ workspace }}}
# Requested precision: {{ precision|comment }}. --int8 builds the QDQ model with explicit quantisation (N9).
PRECISION_FLAGS=${PRECISION_FLAGS-{{ precision_flags }}}

if [ -n "${DYNAMIC_MODEL}" ]; then
{% if profile %}
    "${TRTEXEC}" \
        --onnx="${DYNAMIC_MODEL}" \
        --saveEngine=model.dynamic.plan \
        --memPoolSize=workspace:"${WORKSPACE_MIB}" \
        --minShapes={{ profile.min }} \
        --optShapes={{ profile.opt }} \
        --maxShapes={{ profile.max }} \
        ${PRECISION_FLAGS}
    exit 0
{% else %}
    echo "the buckets do not span one profile (different inputs or symbolic dims)" >&2
    exit 2
{% endif %}
fi
{% for bucket in buckets %}

# bucket {{ bucket.name|comment }}
"${TRTEXEC}" \
    --onnx={{ bucket.onnx }} \
    --saveEngine={{ bucket.engine }} \
    --memPoolSize=workspace:"${WORKSPACE_MIB}" \
{% if bucket.symbolic %}
{# A dim left symbolic is read from the environment (${MIN_<DIM>:?...}), beside the quoted input name. #}
{% for key in ("MIN", "OPT", "MAX") %}
    --{{ key|lower }}Shapes=
    {%- for input in bucket.inputs %}{% if not loop.first %},{% endif %}{{ input.name }}:
        {%- for dim in input.dims %}{% if not loop.first %}x{% endif %}
            {%- if dim is integer %}{{ dim }}{% else %}"${ {{- (key ~ "_" ~ dim)|var }}:?set {{ (key ~ "_" ~ dim)|var }}}"{% endif %}
        {%- endfor %}
    {%- endfor %} \
{% endfor %}
{% endif %}
    ${PRECISION_FLAGS}
{% endfor %}
