"""Input checks at the API boundary: control characters, oversize numbers and dot names are refused (or made
harmless) before anything reaches the database or the artifact store, each with a 4xx that names the field.

Run on PostgreSQL (which refuses a NUL inside text, so a miss here is a 500) and on SQLite (which stores
it, so a miss is a corrupt row or a failed job).
"""

from __future__ import annotations

import json

import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.service.conftest import tiny_onnx

CONTROL_CHARACTERS = ["%00", "%01", "%1F", "%7F", "%C2%85"]  # NUL, SOH, US, DEL, NEL (C1)


def _refused(response, status: int, field: str | None = None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] and error["message"]
    if field is not None:
        assert error["details"]["field"] == field, error
        assert field in error["message"], error
    return error


def _job_total(env, headers) -> int:
    return env.client.get("/jobs", headers=headers).json()["total"]


def _blobs(env) -> set[str]:
    return {p.name for p in env.store.root.glob("??/*")}


# --- path ids, query strings, headers ---------------------------------------------------------------------


@pytest.mark.parametrize("char", CONTROL_CHARACTERS)
@pytest.mark.parametrize(
    ("method", "path", "field"),
    [
        ("GET", "/jobs/abc{c}def", "job_id"),
        ("GET", "/jobs/{c}", "job_id"),
        ("DELETE", "/jobs/{c}", "job_id"),
        ("GET", "/jobs/{c}/events", "job_id"),
        ("GET", "/jobs/{c}/artifacts", "job_id"),
        ("GET", "/jobs/{c}/artifacts/x", "job_id"),
        ("GET", "/jobs/0a8f2c1e-0000-4000-8000-000000000000/artifacts/x{c}y", "name"),
        ("GET", "/ui/jobs/{c}", "job_id"),
        ("GET", "/targets/cpu{c}ort", "name"),
    ],
)
def test_control_characters_in_path_ids_are_422_naming_the_parameter(env, headers, method, path, field, char):
    response = env.client.request(method, path.format(c=char), headers=headers)
    error = _refused(response, 422, field)
    assert error["code"] == "invalid_path_parameter"


def test_control_characters_in_a_path_no_route_has_are_404(env, headers):
    _refused(env.client.get("/no%00such/route", headers=headers), 404)


@pytest.mark.parametrize("query", ["target=cpu%00ort", "cursor=%00", "status=%01", "x%00=1"])
def test_control_characters_in_the_query_string_are_422(env, headers, query):
    error = _refused(env.client.get(f"/jobs?{query}", headers=headers), 422)
    assert error["code"] == "invalid_query_parameter"


@pytest.mark.parametrize("value", ["a\x00b", "a\x01b", "\x7f"])
def test_control_characters_in_headers_are_422_naming_the_header(env, headers, value):
    # Real HTTP servers refuse most of these already; the check holds behind any server (and test clients).
    response = env.submit({**headers, "Idempotency-Key": value})
    assert _refused(response, 422, "idempotency-key")["code"] == "invalid_header"
    # In the key itself: refused before the key lookup.
    response = env.client.get("/jobs", headers={"X-API-Key": f"fdsa_{value}{'0' * 11}_secret"})
    assert _refused(response, 422, "x-api-key")["code"] == "invalid_header"


def test_a_tab_in_a_header_value_is_legal(env, headers):
    assert env.client.get("/jobs", headers={**headers, "User-Agent": "a\tb"}).status_code == 200


# --- the upload's file name ------------------------------------------------------------------------------


def _raw_submit(env, headers, filename: bytes, spec: bytes = b'{"target": "cpu-ort"}'):
    """A multipart body written byte for byte (httpx would percent-encode control characters in a file
    name, as browsers do; curl and hostile clients do not)."""
    boundary = b"edgeboundary"
    body = (
        b"--"
        + boundary
        + b'\r\nContent-Disposition: form-data; name="model"; filename="'
        + filename
        + b'"\r\nContent-Type: application/octet-stream\r\n\r\n'
        + tiny_onnx()
        + b"\r\n--"
        + boundary
        + b'\r\nContent-Disposition: form-data; name="spec"\r\n\r\n'
        + spec
        + b"\r\n--"
        + boundary
        + b"--\r\n"
    )
    return env.client.post(
        "/optimize",
        headers={**headers, "Content-Type": "multipart/form-data; boundary=edgeboundary"},
        content=body,
    )


@pytest.mark.parametrize(
    "filename", [b"mo\x00del.onnx", b"model\x01.onnx", b"model\x7f.onnx", b"\x00", b"m\xc2\x85.onnx"]
)
def test_control_characters_in_the_file_name_are_422_and_nothing_is_stored(env, headers, filename):
    before_blobs, before_jobs = _blobs(env), _job_total(env, headers)
    error = _refused(_raw_submit(env, headers, filename), 422, "model.filename")
    assert error["code"] == "invalid_upload"
    assert _blobs(env) == before_blobs and _job_total(env, headers) == before_jobs


@pytest.mark.parametrize(
    ("filename", "stored"),
    [
        ("..", "model.onnx"),
        (".", "model.onnx"),
        ("a/b/..", "model.onnx"),
        ("../../etc/passwd", "passwd"),
        ("dir\\sub\\net.onnx", "net.onnx"),
        ("/", "model.onnx"),
    ],
)
def test_dot_names_and_separators_are_reduced_to_a_base_name(env, headers, filename, stored):
    response = env.submit(
        headers, filename=filename, spec={"target": "cpu-ort", "seed": hash(filename) % 1000}
    )
    assert response.status_code == 202, response.text
    assert env.job(response.json()["job_id"]).model_filename == stored


def test_a_job_uploaded_as_dot_dot_runs(env, headers):
    """End to end through the real worker and compiler: the sanitised name is a file the job can write."""
    if env.backend != "sqlite":
        pytest.skip("one backend is enough for the pipeline run")
    from workers.execute import execute_job

    spec = {"target": "cpu-ort", "measure_latency": False, "never_slower": False, "seed": 7}
    job_id = env.submit(headers, filename="..", spec=spec).json()["job_id"]
    status = execute_job(job_id, settings=env.settings, worker_id="edge-test")
    job = env.job(job_id)
    assert status == job.status == "succeeded", job.error


# --- the spec --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "loc"),
    [
        ({"target": "cpu-ort", "disabled_rules": ["gelu_erf", "a\x00b"]}, ["disabled_rules", 1]),
        ({"target": "cpu-ort", "shape_buckets": {"se\x00q": [1]}}, ["shape_buckets", "se\x00q"]),
        ({"target": "cpu-ort", "input_shapes": {"x\x00": [1, 8]}}, ["input_shapes", "x\x00"]),
        ({"target": "cpu-ort", "input_shapes": {"x": ["batch\x01", 8]}}, ["input_shapes", "x", 0]),
        ({"target": "cpu\x00ort"}, ["target"]),
        ({"target": {"name": "my\x00chip", "vendor": "x"}}, ["target", "name"]),
        ({"target": "cpu-ort", "tolerances": {"float32\x00": {"atol": 1e-4}}}, ["tolerances", "float32\x00"]),
        ({"target": "cpu-ort", "disabled_rules": ["\u0085"]}, ["disabled_rules", 0]),
    ],
)
def test_control_characters_anywhere_in_the_spec_are_422_naming_the_field(env, headers, spec, loc):
    before_blobs, before_jobs = _blobs(env), _job_total(env, headers)
    error = _refused(env.submit(headers, spec=spec), 422)
    assert error["code"] == "invalid_spec"
    assert error["details"][0]["loc"] == loc and error["details"][0]["type"] == "control_character"
    assert _blobs(env) == before_blobs and _job_total(env, headers) == before_jobs


def test_a_lone_surrogate_in_the_spec_is_422(env, headers):
    spec = '{"target": "cpu-ort", "disabled_rules": ["\\ud800"]}'
    error = _refused(env.submit(headers, spec=spec), 422)
    assert error["details"][0]["loc"] == ["disabled_rules", 0]


@pytest.mark.parametrize(
    ("spec", "loc"),
    [
        (
            '{"target": "cpu-ort", "shape_buckets": {"seq": [9223372036854775808]}}',
            ["shape_buckets", "seq", 0],
        ),
        ('{"target": "cpu-ort", "input_shapes": {"x": [1, 18446744073709551616]}}', ["input_shapes", "x", 1]),
        ('{"target": "cpu-ort", "seed": -9223372036854775809}', ["seed"]),
        ('{"target": "cpu-ort", "max_fold_bytes": 1e999}', ["max_fold_bytes"]),
        ('{"target": "cpu-ort", "seed": ' + "9" * 5000 + "}", []),
        ('{"target": "cpu-ort", "seed": NaN}', []),
    ],
)
def test_oversize_numbers_in_the_spec_are_422(env, headers, spec, loc):
    error = _refused(env.submit(headers, spec=spec), 422)
    assert error["code"] == "invalid_spec"
    assert error["details"][0]["loc"] == loc


def test_int64_bounds_themselves_pass_the_edge(env, headers):
    spec = {"target": "cpu-ort", "seed": 2**63 - 1}
    response = env.submit(headers, spec=spec)
    # Whatever RequestSpec makes of it, it is a 202 or a plain 422, never a 500.
    assert response.status_code in (202, 422), response.text


# --- form fields -----------------------------------------------------------------------------------------


def _post_form(env, headers, fields: list[tuple[str, tuple]]):
    return env.client.post("/optimize", headers=headers, files=fields)


def test_the_spec_field_is_bounded(env, headers):
    from service.jobs.upload import MAX_SPEC_BYTES

    spec = json.dumps({"target": "cpu-ort", "disabled_rules": ["x" * MAX_SPEC_BYTES]})
    error = _refused(env.submit(headers, spec=spec), 422)
    assert error["details"] == {"field": "spec", "max_bytes": MAX_SPEC_BYTES}


def test_other_fields_are_bounded_each_and_in_total(env, headers):
    from service.jobs.upload import MAX_FIELD_BYTES, MAX_PARTS

    model = ("model", ("m.onnx", tiny_onnx(), "application/octet-stream"))
    spec = ("spec", (None, '{"target": "cpu-ort"}'))
    one_big = _post_form(env, headers, [model, spec, ("note", (None, "x" * (MAX_FIELD_BYTES + 1)))])
    assert _refused(one_big, 422)["details"] == {"field": "note", "max_bytes": MAX_FIELD_BYTES}
    many = [(f"f{i}", (None, "x" * 100)) for i in range(MAX_PARTS)]
    error = _refused(_post_form(env, headers, [model, spec, *many]), 422)
    assert error["details"] == {"max_parts": MAX_PARTS}


def test_a_part_with_huge_headers_is_refused(env, headers):
    from service.jobs.upload import MAX_PART_HEADER_BYTES

    boundary = "edgeboundary"
    # Lines short enough for the multipart parser's own per-line limit, too many bytes in all.
    pads = "".join(f"X-Pad-{i}: {'p' * 2000}\r\n" for i in range(MAX_PART_HEADER_BYTES // 2000 + 1))
    body = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="spec"\r\n{pads}\r\n{{}}\r\n--{boundary}--\r\n'
    ).encode()
    response = env.client.post(
        "/optimize",
        headers={**headers, "Content-Type": f"multipart/form-data; boundary={boundary}"},
        content=body,
    )
    assert _refused(response, 422)["details"] == {"max_part_header_bytes": MAX_PART_HEADER_BYTES}


# --- external data offsets -------------------------------------------------------------------------------


def _external_model(field: str, value: int) -> bytes:
    weight = numpy_helper.from_array(__import__("numpy").ones((8, 8), "float32"), "w")
    weight.ClearField("raw_data")
    weight.data_location = TensorProto.EXTERNAL
    for key, text in (("location", "weights.bin"), ("offset", "0"), ("length", "256")):
        entry = weight.external_data.add()
        entry.key, entry.value = key, str(value) if key == field else text
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
        [weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    return model.SerializeToString()


@pytest.mark.parametrize("field", ["offset", "length"])
@pytest.mark.parametrize("value", [2**63, 2**64 + 1])
def test_external_data_offset_and_length_beyond_int64_never_give_a_500(env, headers, field, value):
    model = _external_model(field, value)
    onnx.load_from_string(model)  # a well-formed model: what the edge sees is only the numbers
    response = env.submit(headers, model=model, spec={"target": "cpu-ort", "seed": value % 997})
    assert response.status_code in (202, 422), response.text
    if response.status_code == 202 and env.backend == "sqlite":
        from workers.execute import execute_job

        job_id = response.json()["job_id"]
        assert execute_job(job_id, settings=env.settings, worker_id="edge-test") == "failed"
        job = env.client.get(f"/jobs/{job_id}", headers=headers).json()
        assert job["error"]["code"] != "internal_error" and job["error"]["message"], job


# --- tenant names ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["ac\x00me", "acme\x1b[31m", "", " acme", "x" * 65])
def test_keys_create_refuses_tenant_names_that_cannot_be_stored(env, name):
    from service.auth.keys import create_api_key

    with env.sessions() as session, pytest.raises(ValueError, match="tenant name"):
        create_api_key(session, name)


def test_cli_keys_create_refuses_control_characters_before_the_database(monkeypatch, tmp_path):
    from typer.testing import CliRunner

    from service.core.config import get_settings
    from tests.service.test_operations import _cli

    # An unreachable database: the refusal must come before any connection is tried.
    monkeypatch.setenv("FLEXDSA_DATABASE_URL", "postgresql+psycopg://nobody@127.0.0.1:1/none")
    monkeypatch.setenv("FLEXDSA_DATA_DIR", str(tmp_path))
    get_settings.cache_clear()
    try:
        result = CliRunner().invoke(_cli(), ["keys", "create", "--tenant", "ac\x01me"])
        assert result.exit_code == 1 and "control character" in result.output, result.output
    finally:
        get_settings.cache_clear()
