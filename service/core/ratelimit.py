"""Per-tenant rate limits on the requests that cost the service work: ``POST /optimize`` (a job), ``POST
/jobs/{id}/traffic`` (a stored push, which may start a re-specialisation) and the re-specialisation
proposal (``GET``/``POST /jobs/{id}/respecialise``: the model is loaded and specialised per traffic value).
Each is decided from the API key before the body is read (429 with ``Retry-After``, the seconds left in
the window).

A fixed one-minute window per tenant and action: in Redis (``INCR`` + ``EXPIRE``) when the service has one,
so that every API process behind a load balancer shares the count; in this process otherwise (embedded mode
runs one). If Redis is unreachable the limit is not enforced rather than refusing every request: the queue
quota (``max_queued_jobs_per_tenant``, counted in the database) still bounds what a tenant can pile up.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from service.core.errors import QuotaExceeded

log = logging.getLogger("flexdsa.service")
WINDOW_S = 60


@dataclass(frozen=True)
class Action:
    """What is limited, as a sentence can say it ("submitted more than 3 jobs"), and the setting that sets it."""

    name: str
    doing: str
    setting: str


SUBMIT = Action("submit", "submitted more than {limit} jobs", "FLEXDSA_SUBMIT_RATE_PER_MINUTE")
TRAFFIC = Action("traffic", "pushed traffic more than {limit} times", "FLEXDSA_TRAFFIC_RATE_PER_MINUTE")
PROPOSAL = Action(
    "proposal", "asked for more than {limit} re-specialisations or proposals", "FLEXDSA_PROPOSAL_RATE_PER_MINUTE"
)


class RateLimiter:
    def __init__(self, per_minute: dict[str, int | None], redis_client=None) -> None:
        """``per_minute``: action name -> requests per tenant per minute (None or 0: not limited)."""
        self.per_minute = per_minute
        self.redis = redis_client
        self._counts: dict[tuple[str, int, int], int] = {}
        self._lock = threading.Lock()

    def check(self, tenant_id: int, action: Action = SUBMIT, now: float | None = None) -> None:
        """Count one ``action`` of ``tenant_id``; ``QuotaExceeded`` (429) past its limit."""
        limit = self.per_minute.get(action.name)
        if not limit:
            return
        now = time.time() if now is None else now
        window = int(now // WINDOW_S)
        count = self._count(action.name, tenant_id, window)
        if count is not None and count > limit:
            retry_after = max(1, int((window + 1) * WINDOW_S - now) + 1)
            raise QuotaExceeded(
                f"This tenant {action.doing.format(limit=limit)} in the last minute ({action.setting}); "
                f"retry in {retry_after} s.",
                code="rate_limited",
                details={"action": action.name, "limit_per_minute": limit, "retry_after_s": retry_after},
                headers={"Retry-After": str(retry_after)},
            )

    def _count(self, action: str, tenant_id: int, window: int) -> int | None:
        if self.redis is not None:
            # The submit key keeps its earlier name, so a rolling upgrade shares one count.
            key = f"flexdsa:rate:{tenant_id}:{window}" if action == SUBMIT.name else f"flexdsa:rate:{action}:{tenant_id}:{window}"
            try:
                pipe = self.redis.pipeline()
                pipe.incr(key)
                pipe.expire(key, WINDOW_S * 2)
                return int(pipe.execute()[0])
            except Exception as err:  # Redis down: no rate limit rather than no service
                log.warning("rate limit not enforced: Redis unavailable (%s)", err)
                return None
        with self._lock:
            for stale in [k for k in self._counts if k[2] < window]:
                del self._counts[stale]
            key = (action, tenant_id, window)
            self._counts[key] = self._counts.get(key, 0) + 1
            return self._counts[key]
