"""MkDocs hook: the reference pages are generated at build time, so they cannot drift from the code.

* ``reference/http-api.md`` from the service's OpenAPI document (``service.app.create_app().openapi()``):
  every operation with its parameters, body, answers and the security it takes;
* ``reference/options.md`` from the options model (``flexdsa_core.RequestSpec``, the API's ``spec`` and the
  CLI's ``--spec`` file): every field with its type, default and description, nested models in their own
  tables.

Neither file exists in ``docs/``: they are added to the site as generated files (``mkdocs.structure.files.
File.generated``), and a link to them in ``mkdocs.yml``'s ``nav`` is checked like any other (strict mode).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from mkdocs.structure.files import File

_METHODS = ("get", "post", "put", "patch", "delete")


def on_files(files, config):
    files.append(File.generated(config, "reference/http-api.md", content=http_api_page()))
    files.append(File.generated(config, "reference/options.md", content=options_page()))
    return files


# --- the HTTP API -----------------------------------------------------------------------------------------


def _openapi() -> dict:
    from service.app import create_app
    from service.core.config import Settings

    with tempfile.TemporaryDirectory() as folder:  # embedded defaults in a folder nobody keeps
        return create_app(Settings(data_dir=Path(folder), embedded_worker=False)).openapi()


def _cell(text: object) -> str:
    return " ".join(str(text or "").split()).replace("|", "\\|")


def _schema_name(schema: dict | None) -> str:
    if not schema:
        return ""
    if "$ref" in schema:
        return f"`{schema['$ref'].rsplit('/', 1)[-1]}`"
    if schema.get("type") == "array":
        return f"list of {_schema_name(schema.get('items'))}"
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return " or ".join(_schema_name(s) for s in schema[key] if s.get("type") != "null")
    return f"`{schema.get('type', 'object')}`"


def http_api_page() -> str:
    document = _openapi()
    lines = [
        "# HTTP API reference",
        "",
        "Generated from the service's OpenAPI document at build time (the running service serves the same",
        "document at `/openapi.json` and an interactive page at `/docs`). Every error answers",
        '`{"error": {"code", "message", "details"}}`. Authenticate with your API key in the `X-API-Key`',
        "header or as `Authorization: Bearer <key>`; operator surfaces take the operator token as a bearer.",
        "",
    ]
    by_tag: dict[str, list[tuple[str, str, dict]]] = {}
    for path, item in document["paths"].items():
        for method in _METHODS:
            if method in item:
                operation = item[method]
                by_tag.setdefault((operation.get("tags") or ["other"])[0], []).append((path, method, operation))
    for tag in sorted(by_tag):
        lines += [f"## {tag.capitalize()}", "", "| endpoint | what it does |", "|---|---|"]
        lines += [
            f"| [`{method.upper()} {path}`](#{_anchor(method, path)}) | {_cell(operation.get('summary'))} |"
            for path, method, operation in by_tag[tag]
        ]
        lines.append("")
        for path, method, operation in by_tag[tag]:
            lines += _operation(path, method, operation)
    return "\n".join(lines) + "\n"


def _anchor(method: str, path: str) -> str:
    text = f"{method} {path}".lower()
    return "".join(c if c.isalnum() else "-" for c in text).strip("-")


def _operation(path: str, method: str, operation: dict) -> list[str]:
    lines = [f"### {method.upper()} `{path}` {{ #{_anchor(method, path)} }}", ""]
    if operation.get("summary"):
        lines += [f"**{operation['summary']}**", ""]
    if operation.get("description"):
        lines += [operation["description"], ""]
    parameters = operation.get("parameters") or []
    if parameters:
        lines += ["| parameter | in | type | required | description |", "|---|---|---|---|---|"]
        lines += [
            f"| `{p['name']}` | {p['in']} | {_schema_name(p.get('schema'))} | {'yes' if p.get('required') else 'no'} "
            f"| {_cell(p.get('description') or (p.get('schema') or {}).get('description'))} |"
            for p in parameters
        ]
        lines.append("")
    body = (operation.get("requestBody") or {}).get("content") or {}
    for media, content in body.items():
        schema = content.get("schema") or {}
        fields = ", ".join(f"`{name}`" for name in (schema.get("properties") or {}))
        lines += [f"Body (`{media}`): {_schema_name(schema) if '$ref' in schema else fields or _schema_name(schema)}", ""]
    lines += ["| answer | means |", "|---|---|"]
    lines += [
        f"| {status} | {_cell(answer.get('description'))} |" for status, answer in operation.get("responses", {}).items()
    ]
    lines.append("")
    return lines


# --- the options -------------------------------------------------------------------------------------------


def options_page() -> str:
    from flexdsa_core import RequestSpec

    schema = RequestSpec.model_json_schema()
    definitions = schema.pop("$defs", {})
    lines = [
        "# Options reference",
        "",
        "Generated from the options model (`flexdsa_core.RequestSpec`) at build time. The same keys go in the",
        "API's `spec` field, a `flexdsa optimize --spec FILE` / `flexdsa submit --spec FILE` JSON file, and the",
        "job's `report.json`. An unknown key is refused with the closest known one.",
        "",
        "## The request",
        "",
        *_fields_table(schema),
    ]
    for name in sorted(definitions):
        definition = definitions[name]
        if "properties" not in definition:
            continue
        lines += ["", f"## `{name}`", "", _cell(definition.get("description")), "", *_fields_table(definition)]
    return "\n".join(lines) + "\n"


def _type_of(field: dict) -> str:
    if "$ref" in field:
        name = field["$ref"].rsplit("/", 1)[-1]
        return f"[`{name}`](#{name.lower()})"
    if "enum" in field:
        return " \\| ".join(f"`{json.dumps(v)}`" for v in field["enum"])
    if "const" in field:
        return f"`{json.dumps(field['const'])}`"
    for key in ("anyOf", "oneOf"):
        if key in field:
            return " or ".join(_type_of(part) for part in field[key])
    kind = field.get("type", "any")
    if kind == "array":
        return f"list of {_type_of(field.get('items') or {})}"
    if kind == "object" and isinstance(field.get("additionalProperties"), dict):
        return f"map of {_type_of(field['additionalProperties'])}"
    return f"`{kind}`"


def _fields_table(model: dict) -> list[str]:
    required = set(model.get("required") or [])
    rows = ["| key | type | default | description |", "|---|---|---|---|"]
    for name, field in (model.get("properties") or {}).items():
        default = "required" if name in required else f"`{json.dumps(field.get('default'))}`"
        rows.append(f"| `{name}` | {_type_of(field)} | {default} | {_cell(field.get('description'))} |")
    return rows
