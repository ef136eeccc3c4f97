#!/usr/bin/env python3
"""Build the TensorRT engines of this bundle with the tensorrt Python API. Run it on the Jetson Orin Nano:
engines are specific to the device and the TensorRT version.

    python3 build_engine.py                      one engine per shape bucket (static ONNX)
    python3 build_engine.py --bucket NAME        only that bucket
    python3 build_engine.py --dynamic MODEL.onnx one engine for all buckets, from a model whose dims are
                                                 symbolic, with the min/opt/max profile below
    --precision fp32|fp16|int8|mixed, --workspace-mib N, --profile NAME=MIN:OPT:MAX (dims as 1x3x64x64)
"""

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
BUCKETS = {{ buckets }}
# Per input: the shapes the buckets span (opt = the first bucket: kernels are tuned for opt).
PROFILE = {{ profile }}
PRECISION = {{ precision }}
WORKSPACE_MIB = {{ workspace }}


def parse_profile(items):
    profile = {}
    for item in items or []:
        name, _, shapes = item.rpartition("=")
        low, opt, high = (tuple(int(d) for d in part.split("x")) for part in shapes.split(":"))
        profile[name] = {"min": low, "opt": opt, "max": high}
    return profile


def build(onnx_path, engine_path, profile, precision, workspace_mib):
    import tensorrt as trt

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    flags = 0
    if int(trt.__version__.split(".")[0]) < 10:  # TensorRT 8.x (JetPack 5) needs explicit batch
        flags |= 1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = "\n".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        sys.exit(f"TensorRT could not parse {onnx_path}:\n{errors}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_mib << 20)
    if precision == "fp16":
        config.set_flag(trt.BuilderFlag.FP16)
    elif precision in ("int8", "mixed"):
        config.set_flag(trt.BuilderFlag.INT8)  # the model carries Q/DQ: explicit quantisation
    inputs = [network.get_input(i) for i in range(network.num_inputs)]
    dynamic = [tensor for tensor in inputs if any(d < 0 for d in tuple(tensor.shape))]
    if dynamic:
        optimisation = builder.create_optimization_profile()
        for tensor in dynamic:
            shapes = profile.get(tensor.name)
            if shapes is None:
                sys.exit(f"input {tensor.name!r} is dynamic and has no profile: pass --profile {tensor.name}=MIN:OPT:MAX")
            optimisation.set_shape(tensor.name, tuple(shapes["min"]), tuple(shapes["opt"]), tuple(shapes["max"]))
        config.add_optimization_profile(optimisation)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        sys.exit(f"TensorRT could not build an engine from {onnx_path} (see the log above)")
    Path(engine_path).write_bytes(serialized)
    print(f"wrote {engine_path}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bucket", action="append", help="build only these buckets")
    parser.add_argument("--dynamic", metavar="MODEL.onnx", help="one engine with the profile spanning the buckets")
    parser.add_argument("--precision", default=PRECISION, choices=["fp32", "fp16", "int8", "mixed"])
    parser.add_argument("--workspace-mib", type=int, default=WORKSPACE_MIB)
    parser.add_argument("--profile", action="append", help="NAME=MIN:OPT:MAX, dims joined by x")
    args = parser.parse_args()
    profile = {**PROFILE, **parse_profile(args.profile)}
    if args.dynamic:
        build(Path(args.dynamic), HERE / "model.dynamic.plan", profile, args.precision, args.workspace_mib)
        return
    for bucket in BUCKETS:
        if args.bucket and bucket["name"] not in args.bucket:
            continue
        build(HERE / bucket["onnx"], HERE / bucket["engine"], profile, args.precision, args.workspace_mib)


if __name__ == "__main__":
    main()
