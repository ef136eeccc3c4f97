"""Structured logs: one JSON object per line, carrying the job id and tenant of the job being run."""

import io
import json
import logging

from service.core.logs import handler, job_context


def test_json_lines_carry_the_job_and_tenant():
    stream = io.StringIO()
    logger = logging.getLogger("flexdsa.test.logs")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    logger.addHandler(handler("json", stream))
    with job_context("job-123", 7):
        logger.info("job %s: claimed", "job-123")
    logger.warning("outside any job")
    try:
        raise ValueError("boom")
    except ValueError:
        logger.exception("failed", extra={"incident": "abc123"})
    first, second, third = (json.loads(line) for line in stream.getvalue().splitlines() if line.startswith("{"))
    assert (first["job_id"], first["tenant_id"], first["message"]) == ("job-123", 7, "job job-123: claimed")
    assert "job_id" not in second and second["level"] == "warning"
    assert third["incident"] == "abc123" and "ValueError: boom" in third["traceback"]
