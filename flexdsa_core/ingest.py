"""Stage 1, Ingest: turn an upload (a path or bytes) into an ``onnx_ir.Model`` the compiler can trust.

Checks, in the order a user would want to hear about them:

1. The bytes are an ONNX protobuf at all (not empty, not truncated, not a text file), within ``max_bytes``.
2. External data resolves only inside the model's own folder: relative locations, no ``..``, no symlink
   leaving the folder, files present and long enough. Bytes uploads may not reference external data.
3. The model's IR version and default-domain opset are ones the installed ``onnx`` knows (opset >= 7).
4. Every op's domain is one ONNX Runtime's CPU provider runs, or a function defined in the model.
5. The ONNX checker passes, and the graph is sane: it has outputs, no input reads a value nothing
   produces, no cycles (an acyclic graph out of order is sorted, with a warning).

Path uploads are read with ``onnx_ir.load``: external-data tensors stay memory-mapped and are never read
here (their sizes come from shapes), so a >2 GB model is not held in memory, let alone twice.
``save_model`` writes a model back, moving tensors to an external-data file when the total is too big
for one protobuf (or when the model already keeps tensors outside).

Over 500 lines because every refusal (external-data paths, sizes, opsets, domains, nesting) must
be made here, before any other stage reads the model, and each carries its own sentence.
"""

from __future__ import annotations

import functools
import hashlib
import math
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import onnx
import onnx_ir as ir
from google.protobuf.message import DecodeError

from flexdsa_core.errors import ExternalDataError, FlexDSAError, InvalidModelError, UnsupportedModelError
from flexdsa_core.invariants import dangling_inputs

MIN_OPSET = 7
# Domains whose ops ONNX Runtime's CPU execution provider implements.
ORT_CPU_DOMAINS = frozenset({"", "ai.onnx", "ai.onnx.ml", "com.microsoft", "com.microsoft.nchwc"})
# A single protobuf cannot exceed 2 GiB; stay clearly under it.
EXTERNAL_DATA_THRESHOLD = 1_800_000_000
_EXTERNAL_TENSOR_MIN_BYTES = 1024  # smaller tensors stay inline even when a model uses external data


@dataclass
class Ingested:
    # None once a job's Shape Tracker holds the model (its copy shares the tensors).
    model: ir.Model | None
    info: dict
    warnings: list[str] = field(default_factory=list)
    # The upload as parsed, when it holds all its tensors and was not re-sorted: ONNX Runtime loads the original
    # from it with its weights in memory (``in_memory.InMemoryModel.from_proto``). Its tensors are ``model``'s.
    proto: onnx.ModelProto | None = field(default=None, repr=False)


def ingest(source: str | os.PathLike | bytes, *, max_bytes: int | None = None) -> Ingested:
    """Load and check a model; raise ``InvalidModelError``/``UnsupportedModelError`` (and subclasses) with
    a message saying what is wrong and what to do. Never anything else for a bad upload."""
    try:
        if isinstance(source, bytes | bytearray | memoryview):
            return _ingest_bytes(bytes(source), max_bytes)
        return _ingest_path(Path(os.fspath(source)), max_bytes)
    except FlexDSAError:
        raise
    except (RecursionError, MemoryError) as err:
        raise UnsupportedModelError(
            f"The model is too deeply nested or too large to load ({type(err).__name__}). "
            "Simplify the model or split it before uploading."
        ) from err
    except Exception as err:  # a malformed upload that slipped past the explicit checks
        raise InvalidModelError(
            f"The model could not be read: {type(err).__name__}: {err}. "
            "Export it again (e.g. torch.onnx.export) and check it with onnx.checker.check_model."
        ) from err


# --- reading -------------------------------------------------------------------------------------------


def _ingest_bytes(data: bytes, max_bytes: int | None) -> Ingested:
    _check_size(len(data), max_bytes)
    proto = parse_model_bytes(data, what="The upload")
    external = _external_tensor_names(proto)
    if external:
        raise ExternalDataError(
            f"The model keeps {len(external)} tensor(s) in external data files (e.g. '{external[0]}'), "
            "which a single uploaded file cannot carry. Save the model with all tensors inside the .onnx "
            "file (onnx.save_model(model, path, save_as_external_data=False), possible below 2 GB), or "
            "ingest it from its folder by path.",
            details={"external_tensors": external[:20]},
        )
    warnings: list[str] = []
    _check_versions(proto)
    model = ir.serde.deserialize_model(proto)
    _check_domains(model)
    _check_graph(model, warnings)
    _run_checker(ir.serde.serialize_model(model) if warnings else data)  # the upload's bytes: no serialising
    lowered_from = _fit_runtime_ir_version(model, warnings)
    info = _describe(model, sha256=hashlib.sha256(data).hexdigest(), file_bytes=len(data), external_files={})
    info["ir_version_lowered_from"] = lowered_from
    return Ingested(model, info, warnings, proto=None if warnings else proto)


def _ingest_path(path: Path, max_bytes: int | None) -> Ingested:
    if not path.exists():
        raise InvalidModelError(f"No model file at '{path}'. Check the path.")
    if not path.is_file():
        raise InvalidModelError(f"'{path}' is not a file. Point at the .onnx file itself.")
    file_bytes = path.stat().st_size
    _check_size(file_bytes, max_bytes)
    # The file is read once: hashed, parsed and (without external data) checked from the same bytes. What
    # ``onnx_ir.load`` does, less its own read; the checker reading the file again cost 0.18 s on a 211 MB model.
    data = path.read_bytes()
    # Hashing and the ONNX checker's own parse of the bytes let go of the interpreter: they run beside the
    # parse and the checks below (ResNet-50's 47 MB: 0.07 s of 0.2 s). The checker's verdict on the file is
    # the one given unless the graph had to be re-sorted or reads external data (then checked as below).
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="flexdsa-ingest") as beside:
        hashed = beside.submit(lambda: hashlib.sha256(data).hexdigest())
        file_verdict = beside.submit(_checker_verdict, data)
        try:
            proto = onnx.ModelProto.FromString(data)
        except DecodeError as err:
            raise _decode_failure(f"'{path.name}'", file_bytes, err) from err
        model = ir.serde.deserialize_model(proto)
        ir.external_data.set_base_dir(model.graph, os.path.dirname(path))  # external data stays memory-mapped
        _check_is_model(model, f"'{path.name}'", file_bytes)
        external_files = _check_external_data(model, path.parent)
        _check_size(file_bytes + sum(external_files.values()), max_bytes, external=True)
        warnings: list[str] = []
        _check_versions_ir(model)
        _check_domains(model)
        _check_graph(model, warnings)
        if warnings:  # the graph was re-sorted: check what we will use, not the file
            _run_checker(ir.serde.serialize_model(model))
        elif external_files:  # the checker resolves external data next to the file
            _run_checker(path)
        else:
            _refuse_if_rejected(file_verdict.result())
        sha256 = hashed.result()
    lowered_from = _fit_runtime_ir_version(model, warnings)
    info = _describe(model, sha256=sha256, file_bytes=file_bytes, external_files=external_files)
    info["ir_version_lowered_from"] = lowered_from
    return Ingested(model, info, warnings, proto=None if warnings or external_files else proto)


@functools.cache
def runtime_max_ir_version() -> int:
    """The newest IR version the installed ONNX Runtime loads (it refuses newer ones outright)."""
    import onnxruntime as ort

    for version in range(onnx.IR_VERSION, 6, -1):
        probe = onnx.helper.make_model(
            onnx.helper.make_graph(
                [onnx.helper.make_node("Identity", ["x"], ["y"])],
                "probe",
                [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
                [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])],
            ),  # fmt: skip
            opset_imports=[onnx.helper.make_opsetid("", 13)],
            ir_version=version,
        )
        try:
            ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
            return version
        except Exception:  # noqa: BLE001 - "unsupported IR version": try the next older one
            continue
    return 7


def _fit_runtime_ir_version(model: ir.Model, warnings: list[str]) -> int | None:
    """Lower an IR version newer than ONNX Runtime loads (onnx >= 1.20 writes 14 by default, ORT 1.31 takes
    13); the IR version only gates which features may appear, and the checker has passed the model."""
    newest = runtime_max_ir_version()
    if model.ir_version is None or model.ir_version <= newest:
        return None
    original = model.ir_version
    model.ir_version = newest
    warnings.append(
        f"IR version {original} is newer than ONNX Runtime loads; the model is handled as IR version {newest}."
    )
    return original


def _check_size(size: int, max_bytes: int | None, *, external: bool = False) -> None:
    if size == 0:
        raise InvalidModelError("The model file is empty (0 bytes). Upload the .onnx file itself.")
    if max_bytes is not None and size > max_bytes:
        what = "The model with its external data" if external else "The model"
        raise UnsupportedModelError(
            f"{what} is {size:,} bytes, over the {max_bytes:,}-byte limit. Quantize or prune it, "
            "or ask for a higher upload limit.",
            details={"bytes": size, "max_bytes": max_bytes},
        )


def _not_protobuf_message(what: str, size: int) -> str:
    return (
        f"{what} ({size:,} bytes) is not an ONNX model: it does not parse as an ONNX protobuf "
        "(a text file, another format, or a truncated upload). Upload the binary .onnx file as exported, "
        "and check it loads with onnx.load."
    )


def _decode_failure(what: str, size: int, err: Exception) -> FlexDSAError:
    """The parser's refusal as a reason: nesting past its depth limit is told apart from bytes that are
    not protobuf at all (each subgraph level is three message levels: graph, node, attribute)."""
    text = str(err).lower()
    if "depth" in text or "nest" in text or "recursion" in text:
        return UnsupportedModelError(
            f"{what} ({size:,} bytes) nests messages deeper than the protobuf parser allows (100 levels: "
            "subgraphs of If/Loop/Scan nested more than about 30 deep). Flatten the nested control flow "
            "(inline the inner branches) before uploading.",
            details={"reason": "nesting_too_deep"},
        )
    return InvalidModelError(_not_protobuf_message(what, size))


def parse_model_bytes(data: bytes, *, what: str) -> onnx.ModelProto:
    """``data`` parsed as a ModelProto, or the reason it is not one (``InvalidModelError``, or nesting past
    the parser's depth limit: ``UnsupportedModelError``)."""
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except (DecodeError, RuntimeWarning, ValueError) as err:
        raise _decode_failure(what, len(data), err) from err
    if proto.ir_version <= 0 or not proto.HasField("graph") or not proto.opset_import:
        raise InvalidModelError(
            f"{_not_protobuf_message(what, len(data))} (it parsed, but has no "
            f"{'IR version' if proto.ir_version <= 0 else 'graph' if not proto.HasField('graph') else 'opset import'})."
        )
    return proto


def _check_is_model(model: ir.Model, what: str, size: int) -> None:
    if model.ir_version is None or model.ir_version <= 0 or not model.opset_imports:
        raise InvalidModelError(
            f"{_not_protobuf_message(what, size)} (it parsed, but has no IR version or opset)."
        )


# --- external data ---------------------------------------------------------------------------------------


def _external_tensor_names(proto: onnx.ModelProto) -> list[str]:
    from flexdsa_core._libraries import onnx_tensors  # here: it loads onnxscript, which ingest needn't

    names = []
    for tensor in onnx_tensors(proto):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            names.append(tensor.name or "<unnamed>")
    return names


def _all_tensors(model: ir.Model) -> Iterator[ir.TensorProtocol]:
    """Initializers of every graph and tensors held in node attributes, functions included."""
    graphs: list[ir.Graph | ir.Function] = [model.graph, *model.functions.values()]
    seen: set[int] = set()
    while graphs:
        graph = graphs.pop()
        if isinstance(graph, ir.Graph):
            for value in graph.initializers.values():
                if value.const_value is not None and id(value.const_value) not in seen:
                    seen.add(id(value.const_value))
                    yield value.const_value
        for node in graph:
            for attr in node.attributes.values():
                if attr.is_ref():
                    continue
                if attr.type == ir.AttributeType.TENSOR:
                    yield attr.value
                elif attr.type == ir.AttributeType.TENSORS:
                    yield from attr.value
                elif attr.type == ir.AttributeType.GRAPH:
                    graphs.append(attr.value)
                elif attr.type == ir.AttributeType.GRAPHS:
                    graphs.extend(attr.value)


_INT64_MAX = 2**63 - 1
# ONNX Runtime reads a location like '*/_ORT_MEM_ADDR_/*' as "the offset is a pointer into my memory".
ORT_MEMORY_MARKER = "_ORT_MEM_ADDR_"


def _check_external_data(model: ir.Model, folder: Path) -> dict[str, int]:
    """Every external location is a relative path inside ``folder`` to a file long enough for the tensor.
    Returns {relative file name: size in bytes} of the external files used."""
    root = folder.resolve()
    files: dict[str, int] = {}
    for tensor in _all_tensors(model):
        if not isinstance(tensor, ir.ExternalTensor):
            continue
        location = os.fspath(tensor.location)
        name = tensor.name or "<unnamed>"
        fix = "Save the model with its external data next to it (onnx.save_model(..., save_as_external_data=True, location='weights.bin')) and upload that folder."
        if not location:
            raise ExternalDataError(f"Tensor '{name}' is marked external but names no file. {fix}")
        if ORT_MEMORY_MARKER in location:  # ONNX Runtime would read its offset as an address in its memory
            raise ExternalDataError(
                f"Tensor '{name}' names ONNX Runtime's in-memory marker ('{location}'): an address in the "
                f"process's memory, not a file. {fix}",
                details={"tensor": name, "location": location},
            )
        if os.path.isabs(location) or Path(location).is_absolute() or location.startswith(("/", "\\")):
            raise ExternalDataError(
                f"Tensor '{name}' points at the absolute path '{location}'; external data must sit in the "
                f"model's own folder. {fix}",
                details={"tensor": name, "location": location},
            )
        if ".." in Path(location.replace("\\", "/")).parts:
            raise ExternalDataError(
                f"Tensor '{name}' points outside the model's folder ('{location}'). {fix}",
                details={"tensor": name, "location": location},
            )
        target = (folder / location).resolve()
        if not target.is_relative_to(root):
            raise ExternalDataError(
                f"Tensor '{name}': '{location}' is a link that resolves outside the model's folder. {fix}",
                details={"tensor": name, "location": location},
            )
        if not target.is_file():
            raise ExternalDataError(
                f"Tensor '{name}' needs the external data file '{location}', which is missing. Upload the "
                "model together with its data files, in the same folder layout.",
                details={"tensor": name, "location": location},
            )
        stat = target.stat()
        if stat.st_nlink > 1:  # onnx and onnx_ir refuse these too: a hard link can alias any file
            raise ExternalDataError(
                f"Tensor '{name}': the external data file '{location}' has {stat.st_nlink} hard links, so it "
                "could alias a file outside the model's folder. Store uploaded data files as copies, not "
                "hard links.",
                details={"tensor": name, "location": location},
            )
        size = stat.st_size
        offset = tensor.offset or 0
        length = tensor.length if tensor.length is not None else tensor.nbytes
        for which, value in (("offset", offset), ("length", length)):
            # Readers hold these in a signed 64-bit file offset: a larger one is no place in any file.
            if not 0 <= value <= _INT64_MAX:
                raise ExternalDataError(
                    f"Tensor '{name}': its external data {which} {value} is outside 0..2^63-1, so no file can "
                    f"hold it. {fix}",
                    details={"tensor": name, "location": location, which: str(value)},
                )
        if offset + length > size or length < tensor.nbytes:
            raise ExternalDataError(
                f"Tensor '{name}' needs bytes {offset:,}..{offset + length:,} of '{location}' "
                f"({tensor.nbytes:,} bytes for its shape), but the file has {size:,}: it is truncated or "
                "does not belong to this model. Upload the data file saved with the model.",
                details={"tensor": name, "location": location},
            )
        files[location] = size
    return files


# --- versions and domains -----------------------------------------------------------------------------


def _check_ir_version(ir_version: int) -> None:
    if ir_version > onnx.IR_VERSION:
        raise UnsupportedModelError(
            f"The model's IR version {ir_version} is newer than this compiler's onnx supports "
            f"({onnx.IR_VERSION}). Export with an older ONNX IR version (or opset).",
        )


def _check_opset(domain: str, version: int) -> None:
    if domain not in ("", "ai.onnx"):
        return
    newest = onnx.defs.onnx_opset_version()
    if version < MIN_OPSET:
        raise UnsupportedModelError(
            f"The model uses ONNX opset {version}; the oldest supported is {MIN_OPSET}. Convert it first: "
            f"onnx.version_converter.convert_version(model, 17).",
            details={"opset": version},
        )
    if version > newest:
        raise UnsupportedModelError(
            f"The model uses ONNX opset {version}, newer than the {newest} this compiler knows. Export "
            f"with opset {newest} or older.",
            details={"opset": version},
        )


def _check_versions(proto: onnx.ModelProto) -> None:
    _check_ir_version(proto.ir_version)
    for opset in proto.opset_import:
        _check_opset(opset.domain, opset.version)


def _check_versions_ir(model: ir.Model) -> None:
    _check_ir_version(model.ir_version)
    for domain, version in model.opset_imports.items():
        _check_opset(domain, version)


def _all_nodes(model: ir.Model) -> Iterator[ir.Node]:
    yield from ir.traversal.RecursiveGraphIterator(model.graph)
    for function in model.functions.values():
        yield from ir.traversal.RecursiveGraphIterator(function)


def _check_domains(model: ir.Model) -> None:
    local_functions = {(function.domain, function.name) for function in model.functions.values()}
    unknown: dict[str, set[str]] = {}
    for node in _all_nodes(model):
        if node.domain in ORT_CPU_DOMAINS or (node.domain, node.op_type) in local_functions:
            continue
        unknown.setdefault(node.domain, set()).add(node.op_type)
    if unknown:
        listing = "; ".join(
            f"'{domain}': {', '.join(sorted(ops))}" for domain, ops in sorted(unknown.items())
        )
        raise UnsupportedModelError(
            f"The model uses ops from domain(s) ONNX Runtime's CPU provider does not know ({listing}). "
            "Replace them with standard ONNX ops, or define them as functions inside the model.",
            details={"unknown_domains": {domain: sorted(ops) for domain, ops in unknown.items()}},
        )


# --- checker and graph sanity ---------------------------------------------------------------------------


def _run_checker(model: onnx.ModelProto | Path | bytes) -> None:
    _refuse_if_rejected(_checker_verdict(model))


def _checker_verdict(model: onnx.ModelProto | Path | bytes) -> onnx.checker.ValidationError | None:
    """What the ONNX checker says against ``model``; None when it accepts it."""
    try:
        if isinstance(model, Path):
            onnx.checker.check_model(os.fspath(model))
        else:
            onnx.checker.check_model(model)  # bytes go to the C++ checker as they are, a proto is serialised
    except onnx.checker.ValidationError as err:
        return err
    return None


def _refuse_if_rejected(err: onnx.checker.ValidationError | None) -> None:
    if err is not None:
        message = str(err).strip().splitlines()[0].rstrip(".") if str(err).strip() else "no details"
        raise InvalidModelError(
            f"The ONNX checker rejects the model: {message}. Fix the exporter output (the ONNX checker "
            "reports the same with onnx.checker.check_model(path)).",
            details={"checker": str(err)},
        ) from err


def _check_graph(model: ir.Model, warnings: list[str]) -> None:
    graph = model.graph
    if not graph.outputs:
        raise InvalidModelError(
            "The graph has no outputs, so it computes nothing. Export it with its outputs."
        )
    _check_graph_inputs_are_produced(graph)
    if not _is_sorted(graph):
        try:
            graph.sort()
        except Exception as err:
            raise InvalidModelError(
                "The graph has a cycle: a node (indirectly) reads its own output. ONNX graphs must be "
                "acyclic; re-export the model.",
            ) from err
        warnings.append("The graph's nodes were not in topological order; they were sorted.")


def _check_graph_inputs_are_produced(graph: ir.Graph) -> None:
    """No node (in any subgraph) reads a value that no node, graph input or initializer provides."""
    for node, value in dangling_inputs(graph):
        raise InvalidModelError(
            f"Node '{node.name or node.op_type}' ({node.op_type}) reads '{value.name}', which no node, graph "
            "input or initializer provides (a dangling input). Re-export the model.",
            details={"node": node.name, "value": value.name},
        )
    for value in graph.outputs:
        if value.producer() is None and not value.is_graph_input() and not value.is_initializer():
            raise InvalidModelError(
                f"Graph output '{value.name}' is produced by nothing. Re-export the model.",
                details={"value": value.name},
            )


def _is_sorted(graph: ir.Graph) -> bool:
    seen: set[int] = set()
    for node in graph:
        for value in node.inputs:
            producer = value.producer() if value is not None else None
            if producer is not None and producer.graph is graph and id(producer) not in seen:
                return False
        seen.add(id(node))
    return True


# --- description ----------------------------------------------------------------------------------------


def _describe(model: ir.Model, *, sha256: str, file_bytes: int, external_files: dict[str, int]) -> dict:
    initializers = list(model.graph.initializers.values())
    parameter_bytes = 0
    for value in initializers:
        tensor = value.const_value
        if tensor is not None:  # nbytes comes from dtype and shape: external data is not read
            parameter_bytes += math.ceil(tensor.size * tensor.dtype.itemsize)
    domains_used = sorted({node.domain or "ai.onnx" for node in _all_nodes(model)})
    return {
        "ir_version": model.ir_version,
        "opset_imports": {domain or "ai.onnx": version for domain, version in model.opset_imports.items()},
        "producer": {"name": model.producer_name or "", "version": model.producer_version or ""},
        "node_count": sum(1 for _ in _all_nodes(model)),
        "initializer_count": len(initializers),
        "parameter_bytes": parameter_bytes,
        "domains_used": domains_used,
        "unknown_domains": [],  # a model with any is refused; listed in the error's details
        "function_domains": sorted({function.domain for function in model.functions.values()}),
        "inputs": [value.name for value in model.graph.inputs],
        "outputs": [value.name for value in model.graph.outputs],
        "external_data": bool(external_files),
        "external_data_files": sorted(external_files),
        "file_bytes": file_bytes,
        "total_bytes": file_bytes + sum(external_files.values()),
        "sha256": sha256,
    }


# --- saving ---------------------------------------------------------------------------------------------


def needs_external_data(model: ir.Model, *, external_data_threshold: int = EXTERNAL_DATA_THRESHOLD) -> bool:
    """Whether ``save_model`` would write external data: too big for one protobuf, or already external
    (such a model cannot be handed to ONNX Runtime as bytes either)."""
    tensors = list(_all_tensors(model))
    if any(isinstance(tensor, ir.ExternalTensor) for tensor in tensors):
        return True
    return sum(math.ceil(tensor.size * tensor.dtype.itemsize) for tensor in tensors) > external_data_threshold


def save_model(
    model: ir.Model, path: str | os.PathLike, *, external_data_threshold: int = EXTERNAL_DATA_THRESHOLD
) -> list[Path]:
    """Write ``model`` to ``path``; returns the files written.

    Tensors go to ``<name>.data`` next to the model when their total exceeds ``external_data_threshold``
    bytes (one protobuf cannot pass 2 GiB), or when the model already reads tensors from external files
    (their old locations would not resolve from a new folder).
    """
    path = Path(os.fspath(path))
    tensors = list(_all_tensors(model))
    total = sum(math.ceil(tensor.size * tensor.dtype.itemsize) for tensor in tensors)
    already_external = [tensor for tensor in tensors if isinstance(tensor, ir.ExternalTensor)]
    if total <= external_data_threshold and not already_external:
        ir.save(model, path, format="protobuf")
        return [path]
    data_name = f"{path.name}.data"
    sources = {Path(os.fspath(tensor.path)).resolve() for tensor in already_external}
    suffix = 0
    while (path.parent / data_name).resolve() in sources:  # never overwrite the data we are reading
        suffix += 1
        data_name = f"{path.name}.{suffix}.data"
    ir.save(
        model,
        path,
        format="protobuf",
        external_data=data_name,
        size_threshold_bytes=_EXTERNAL_TENSOR_MIN_BYTES,
    )
    return [path, path.parent / data_name]
