"""A custom target is refused before anything is stored or queued when it takes a built-in's name (its
figures would pass for the built-in's) or names an adapter that is not registered (the name picks a module
to import): 422 with the reason, the valid names, and no job."""

from __future__ import annotations

import json

from flexdsa_core import load_target


def _custom(**fields) -> dict:
    data = load_target("rockchip-rk3588").model_dump(mode="json")
    data.update(mem_bandwidth_bytes_per_s=1.0, peak_ops_per_s=dict.fromkeys(data["peak_ops_per_s"], 1.0))
    return {**data, **fields}


def _refused(env, headers, target: dict) -> dict:
    response = env.submit(headers, spec={"target": target})
    assert response.status_code == 422, response.text
    assert env.client.get("/jobs", headers=headers).json()["total"] == 0 and env.enqueued == []
    return response.json()["error"]


def test_a_custom_target_under_a_builtin_name_is_422(env, headers):
    error = _refused(env, headers, _custom())
    assert error["message"].startswith(
        "'rockchip-rk3588' is a built-in target; give your custom target another name"
    )
    assert error["details"]["loc"] == ["target", "name"]
    assert env.submit(headers, spec={"target": _custom(name="my-rk3588")}).status_code == 202


def test_a_custom_target_naming_an_unregistered_adapter_is_422(env, headers):
    error = _refused(env, headers, _custom(name="my-rk3588", adapter="rockchip.driver"))
    assert error["code"] == "invalid_target"
    text = json.dumps(error)
    assert "unknown adapter 'rockchip.driver'" in text and "accelerator, amd, cpu_ort" in text
