"""``bench.graph_work``: graph work is every stage but the checks, measured in interleaved rounds beside onnxsim
(which the test environment may lack: then its cells say why, and ours are still measured)."""

from __future__ import annotations

from bench.exports import empty_model
from bench.graph_work import measure
from bench.run import CHECK_STAGES, graph_work


def test_graph_work_leaves_out_the_checks_and_timings():
    stages = {"ingest": 0.5, "fusion": 0.25, "validate": 3.0, "kernel_timing": 2.0, "measure": 1.0, "precision": 9.0}
    assert graph_work(stages) == 0.75


def test_one_round_measures_our_graph_work_and_says_why_a_peer_did_not_run(tmp_path):
    model = empty_model(tmp_path / "relu.onnx")
    found = measure(model, "relu", rounds=1, timeout_s=300)
    [work] = found["graph_work_s"]
    assert work > 0
    assert found["stages_median_s"] and not set(found["stages_median_s"]) & CHECK_STAGES
    assert abs(work - sum(found["stages_median_s"].values())) < 1e-9  # one round: the medians are its stages
    assert not [error for error in found["errors"] if error.startswith("flexdsa")]
    if found["onnxsim_s"]:  # installed (the bench extra): timed, and the ratio follows
        assert found["ratio"] == work / found["onnxsim_s"][0]
    else:
        assert found["ratio"] is None and any(error.startswith("onnxsim: import failed") for error in found["errors"])
