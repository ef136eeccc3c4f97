"""A model's names never run as shell: every target's generated shell scripts, for a model whose input, output
and symbolic dim names (and, given to the adapters directly, bucket names) hold shell metacharacters, are run
with bash and stand-in vendor tools that record their argv. No command hidden in a name may run (the canary
file stays absent), and each name must reach the tools as data, intact, inside one argument.

ONNX allows any string as a value name or a dim name, and the pipeline keeps them. The bucket names it makes are
sanitised (``shape_tracker``), so hostile bucket names are given to the adapters' ``generate`` directly."""

from __future__ import annotations

import io
import re
import subprocess
import tokenize
from pathlib import Path

import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper

import flexdsa_core.targets.render as templates
from flexdsa_core import FlexDSAOptimizer, OptimizeOptions
from flexdsa_core.cache import LRUCache
from flexdsa_core.targets import BucketModel, get_adapter, list_targets, load_target
from flexdsa_core.targets.render import shell_word

CANARY = "CANARY"
# Each name tries every way out of a shell word: substitution, expansion, separators, quotes, globs, and a
# newline that would end a comment and start a command.
INPUT = f"in $(touch {CANARY}) `touch {CANARY}`;touch {CANARY} & 'q' \"d\" $HOME | * \\\ntouch {CANARY}\n"
OTHER_INPUT = f"$HOME'\"{{a,b}}\"'$(touch {CANARY})*"
OUTPUT = f"out $(touch {CANARY})\ntouch {CANARY}"
DIM = f"n $(touch {CANARY})\ntouch {CANARY};'x'"
BUCKET = f"b $(touch {CANARY}) `touch {CANARY}`;touch {CANARY}\ntouch {CANARY} 'q' \"d\" $HOME&|*"

# Pieces of the names above that a sanitised bucket name cannot hold: an argument with one holds a whole name.
PIECES = ("$(touch", "`touch", f"touch {CANARY}")
# The vendor tools the scripts call: each stand-in records its name and argv, NUL-separated, and exits 0.
TOOLS = ("trtexec", "qnn-onnx-converter", "qnn-model-lib-generator", "qnn-context-binary-generator", "atc",
         "vai_c_xir", "python3")  # fmt: skip
STAND_IN = '#!/usr/bin/env bash\nprintf "%s\\0" "${0##*/}" "$#" "$@" >> "${ARGV_LOG}"\n'
# How to run each script: the argument lists it is run with (a file named so is made in the bundle first).
RUNS = {
    "trtexec.sh": [[], ["model.onnx"]],
    "convert_qnn.sh": [["calib.txt"]],
    "atc.sh": [[]],
    "atc_dynamic_dims.sh": [["model.onnx"]],
    "compile_kv260.sh": [["ds.txt"]],
}
# The tools that are given the model's input names, and so must receive them intact.
TAKES_INPUT_NAMES = {"trtexec", "atc", "qnn-onnx-converter"}
# Symbolic dims in trtexec.sh come from the environment: MIN_<DIM>, OPT_<DIM>, MAX_<DIM>.
PROFILE_ENV = {f"{key}_{re.sub('[^A-Za-z0-9]', '_', DIM).upper()}": value
               for key, value in (("MIN", "1"), ("OPT", "2"), ("MAX", "4"))}  # fmt: skip


def _model(dims: list[int | str]) -> onnx.ModelProto:
    """``OUTPUT = Add(Relu(INPUT), OTHER_INPUT)``, both inputs of shape ``dims``."""
    inputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, dims) for name in (INPUT, OTHER_INPUT)]
    output = helper.make_tensor_value_info(OUTPUT, TensorProto.FLOAT, dims)
    nodes = [helper.make_node("Relu", [INPUT], ["relu"], name="relu"),
             helper.make_node("Add", ["relu", OTHER_INPUT], [OUTPUT], name="add")]  # fmt: skip
    model = helper.make_model(helper.make_graph(nodes, "hostile", inputs, [output]),
                              opset_imports=[helper.make_opsetid("", 17)])  # fmt: skip
    model.ir_version = 9
    onnx.checker.check_model(model)
    return model


def _stand_ins(folder: Path) -> Path:
    folder.mkdir()
    for tool in TOOLS:
        (folder / tool).write_text(STAND_IN)
        (folder / tool).chmod(0o755)
    return folder


def _calls(log: Path) -> list[tuple[str, list[str]]]:
    """(tool, argv) of every stand-in call recorded in ``log``."""
    fields = log.read_bytes().decode().split("\0")[:-1] if log.exists() else []
    calls = []
    while fields:
        tool, count, fields = fields[0], int(fields[1]), fields[2:]
        calls.append((tool, fields[:count]))
        fields = fields[count:]
    return calls


def _write(files: dict, folder: Path) -> None:
    folder.mkdir()
    for name, content in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content.read_bytes() if isinstance(content, Path) else content)


def _xmodel_for_the_first_bucket(bundle: Path) -> None:
    """compile_kv260.sh runs vai_c_xir where the quantiser's xmodel is: the first bucket's only (the others
    take the script's not-found branch)."""
    others = (".qdq.onnx", ".portable.onnx")
    models = sorted(p.name for p in bundle.glob("model.*.onnx") if not p.name.endswith(others))
    (bundle / "quantized").mkdir()
    for model in models[:1]:
        net = model.removesuffix(".onnx").replace(".", "_")
        (bundle / "quantized" / f"{net}_int.xmodel").write_text("")


def _run_scripts(files: dict, tmp_path: Path) -> dict[str, list]:
    """Every ``.sh`` of ``files``, written to a bundle folder and run as RUNS says with the stand-ins first on
    PATH; per script, its runs' (completed process, stand-in calls). Checks each passes ``bash -n``, each run
    exits 0 (or 2, refusing without calling a tool), and no command hidden in a name ran."""
    bundle = tmp_path / "bundle"
    _write(files, bundle)
    for made in ("model.onnx", "calib.txt", "ds.txt"):
        if not (bundle / made).exists():
            (bundle / made).write_text("")
    _xmodel_for_the_first_bucket(bundle)
    stand_ins = _stand_ins(tmp_path / "bin")
    home = tmp_path / "home"
    home.mkdir()
    ran = {}
    for name in sorted(n for n in files if n.endswith(".sh")):
        assert name in RUNS, f"{name}: say in RUNS how the test runs it"
        subprocess.run(["bash", "-n", str(bundle / name)], check=True)
        ran[name] = []
        for args in RUNS[name]:
            log = tmp_path / f"argv.{name}.{len(ran[name])}"
            env = {"PATH": f"{stand_ins}:/usr/bin:/bin", "HOME": str(home), "ARGV_LOG": str(log)}
            done = subprocess.run(["bash", name, *args], cwd=bundle, env=env | PROFILE_ENV, capture_output=True,
                                  text=True, timeout=60)  # fmt: skip
            calls = _calls(log)
            assert done.returncode == 0 or (done.returncode == 2 and not calls), (name, args, done.stderr)
            ran[name].append((done, calls))
    assert not list(tmp_path.rglob(CANARY)), "a command hidden in a name ran"
    return ran


def _assert_names_intact(ran: dict[str, list], names: tuple[str, ...]) -> None:
    """No argument holds a piece of a name without the whole of it (a name split into words, or expanded, would),
    and each tool that takes input names got every one, unchanged, in one argument of some call."""
    calls = [call for runs in ran.values() for _, made in runs for call in made]
    assert calls, "no script called a vendor tool"
    for tool, argv in calls:
        for arg in argv:
            if any(piece in arg for piece in PIECES):
                assert any(name in arg for name in names), f"{tool} got a piece of a name: {arg!r} in {argv}"
    for tool in TAKES_INPUT_NAMES & {tool for tool, _ in calls}:
        given = [arg for name, argv in calls if name == tool for arg in argv]
        for name in (INPUT, OTHER_INPUT):
            assert any(name in arg for arg in given), f"{tool} never got {name!r} intact: {given}"
    for tool, argv in calls:
        if tool == "qnn-onnx-converter":
            assert argv[argv.index("-d") + 1] == INPUT  # a name that is a whole argument arrives exactly


def _assert_python_keeps_names_in_strings(files: dict) -> None:
    """The Python templates take names through repr: each bundle .py compiles, and a name shows only in its
    string literals, never in code or a comment."""
    for name, content in files.items():
        if name.endswith(".py"):
            text = content.decode()
            compile(text, name, "exec")
            for token in tokenize.generate_tokens(io.StringIO(text).readline):
                if "$(touch" in token.string:
                    assert token.type == tokenize.STRING, (name, token)


# ---- an optimised bundle, end to end --------------------------------------------------------------------


@pytest.mark.parametrize("buckets", [{DIM: [1, 2]}, None], ids=["two-buckets", "symbolic"])
@pytest.mark.parametrize("target", [t.name for t in list_targets()])
def test_an_optimised_bundles_scripts_take_the_names_as_data(target, buckets, tmp_path):
    options = OptimizeOptions(measure_latency=False, calibrate=False, allow_synthetic_calibration=True,
                              shape_buckets=buckets)  # fmt: skip
    result = FlexDSAOptimizer(target).optimize(_model([DIM, 3, 8, 8]), options, cache=LRUCache())
    files = {name: content if isinstance(content, bytes) else content.read_bytes()
             for name, content in result.artifacts.items()}  # fmt: skip
    _assert_python_keeps_names_in_strings(files)
    if not any(name.endswith(".sh") for name in files):
        pytest.skip(f"{target}'s bundle has no shell script")
    ran = _run_scripts(files, tmp_path)
    _assert_names_intact(ran, (INPUT, OTHER_INPUT))


def test_the_symbolic_dims_reach_trtexec_from_the_environment(tmp_path):
    """The bucket that kept its dims symbolic takes them from MIN_/OPT_/MAX_<DIM>; the name stays intact."""
    options = OptimizeOptions(measure_latency=False)
    result = FlexDSAOptimizer("nvidia-orin-nano").optimize(_model([DIM, 3, 8, 8]), options, cache=LRUCache())
    files = {name: content for name, content in result.artifacts.items() if name.endswith(".sh")}
    (_, calls), (_, model_calls) = _run_scripts(files, tmp_path)["trtexec.sh"]
    assert model_calls == []  # `trtexec.sh MODEL`: one symbolic bucket spans no profile
    [(_, argv)] = calls
    assert f"--minShapes={INPUT}:1x3x8x8,{OTHER_INPUT}:1x3x8x8" in argv
    assert f"--maxShapes={INPUT}:4x3x8x8,{OTHER_INPUT}:4x3x8x8" in argv


# ---- hostile bucket names, given to the adapters ------------------------------------------------------


def _bucket(name: str, dims: list[int | str]) -> BucketModel:
    model = ir.from_proto(_model(dims))
    return BucketModel(name, model, {v.name: list(dims) for v in model.graph.inputs})


@pytest.mark.parametrize("target", [t.name for t in list_targets()])
def test_hostile_bucket_names_stay_data(target, tmp_path):
    spec = load_target(target)
    buckets = [_bucket(BUCKET, [1, 3, 8, 8]), _bucket(BUCKET + "2", [2, 3, 8, 8])]
    files = get_adapter(spec).generate(buckets, spec, {})
    _assert_python_keeps_names_in_strings(files)
    if not any(name.endswith(".sh") for name in files):
        pytest.skip(f"{target}'s bundle has no shell script")
    ran = _run_scripts(files, tmp_path)
    _assert_names_intact(ran, (INPUT, OTHER_INPUT, BUCKET))
    for done, calls in ran.get("compile_kv260.sh", []):  # the first bucket's xmodel is there, the second's not
        [argv] = [argv for tool, argv in calls if tool == "vai_c_xir"]
        assert argv[argv.index("-o") + 1] == f"compiled/{BUCKET}"
        assert f"bucket {BUCKET}2: " in done.stderr


def test_a_bucket_left_symbolic_is_named_in_a_comment_only(tmp_path):
    """atc.sh says which dims of a bucket are not fixed, in a comment a newline in the dim name cannot end."""
    spec = load_target("huawei-ascend310b")
    files = get_adapter(spec).generate([_bucket(BUCKET, [DIM, 3, 8, 8])], spec, {})
    ran = _run_scripts(files, tmp_path)
    _assert_names_intact(ran, (INPUT, OTHER_INPUT, BUCKET))
    comments = [line for line in files["atc.sh"].decode().splitlines() if "not fixed" in line]
    assert len(comments) == 1 and comments[0].startswith("# bucket ")


# ---- the quoting rules (flexdsa_core/targets/render.py) ----------------------------------------------------


@pytest.mark.parametrize("text", [INPUT, OUTPUT, DIM, BUCKET, "", "plain", "tab\there", "é ü\u2028\x1b[0m", "\\'"])
def test_a_value_is_one_shell_word_on_one_line(text):
    word = shell_word(text)
    assert "\n" not in word
    done = subprocess.run(["bash", "-c", f"printf %s {word}"], capture_output=True, env={"LC_ALL": "C"})
    assert done.stdout == text.encode()


def test_the_shell_mode_refuses_what_it_cannot_quote():
    environment = templates._environment(shell=True)
    for value in (None, ["a", "b"], True):
        with pytest.raises(TypeError, match="strings and numbers"):
            environment.from_string("x {{ value }}").render(value=value)
    with pytest.raises(ValueError, match="not a shell variable name"):
        environment.from_string("${ {{- value|var }}}").render(value="A B")
    with pytest.raises(ValueError, match="comment lines"):
        templates._check_comment_filters("t.sh", "echo {{ value|comment }}")
    rendered = environment.from_string("# {{ value|comment }}\n").render(value="a\ntouch x")
    assert rendered == "# a\\ntouch x\n"
