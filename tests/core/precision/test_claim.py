"""``precision.scoring.claim``: what a shipped figure rests on, and the warnings a user reads beside it."""

from pathlib import Path

import numpy as np

from flexdsa_core.accuracy import score
from flexdsa_core.holdout import plan
from flexdsa_core.options import OptimizeOptions
from flexdsa_core.precision.scoring import PrecisionRun, claim


def _run(options: OptimizeOptions, count: int, tmp_path: Path) -> PrecisionRun:
    samples = [{"x": np.zeros((1, 4), np.float32)} for _ in range(count)]
    run = PrecisionRun(options=options, target=None, original=b"", fp32_model=None, samples=samples,
                       synthetic=False, workdir=tmp_path)  # fmt: skip
    run.split = plan(count, options.holdout)
    run.use_fold(0)
    return run


def _one_turned(count: int) -> tuple[list[dict], list[dict]]:
    rng = np.random.default_rng(0)
    reference = [{"embedding": rng.standard_normal((1, 64)).astype(np.float32)} for _ in range(count)]
    got = [{"embedding": r["embedding"].copy()} for r in reference]
    got[3]["embedding"][0, :12] *= -1  # one sample's embedding turns; the pooled cosine still meets 0.99
    return reference, got


def test_a_sample_below_the_target_is_named_where_the_pooled_cosine_hides_it(tmp_path):
    options = OptimizeOptions(precision="int8")
    reference, got = _one_turned(60)
    found = score(reference, got, options.accuracy)
    assert found["ok"] and found["outputs"]["embedding"]["worst_sample_cosine"] < 0.99
    _, warnings = claim(_run(options, 60, tmp_path), found)
    single = [w for w in warnings if "one sample alone" in w]
    assert len(single) == 1 and "'embedding'" in single[0] and "min_sample_cosine" in single[0], warnings
    # Asked for (and met: the same samples, none turned), nothing is said of it.
    strict = OptimizeOptions(precision="int8", accuracy={"min_sample_cosine": 0.99})
    exact = score(reference, reference, strict.accuracy)
    assert not [w for w in claim(_run(strict, 60, tmp_path), exact)[1] if "one sample alone" in w]
