"""Per-tenant submit rate limit: at most ``submit_rate_per_minute`` ``POST /optimize`` per tenant per minute,
decided from the API key before the body is read (429 with ``Retry-After``, the seconds left in the window).

A fixed one-minute window per tenant: in Redis (``INCR`` + ``EXPIRE``) when the service has one, so that
every API process behind a load balancer shares the count; in this process otherwise (embedded mode runs
one). If Redis is unreachable the limit is not enforced rather than refusing every submit: the queue quota
(``max_queued_jobs_per_tenant``, counted in the database) still bounds what a tenant can pile up.
"""

from __future__ import annotations

import logging
import threading
import time

from service.errors import QuotaExceeded

log = logging.getLogger("flexdsa.service")
WINDOW_S = 60


class RateLimiter:
    def __init__(self, per_minute: int | None, redis_client=None) -> None:
        self.per_minute = per_minute
        self.redis = redis_client
        self._counts: dict[tuple[int, int], int] = {}
        self._lock = threading.Lock()

    def check(self, tenant_id: int, now: float | None = None) -> None:
        """Count one submit for ``tenant_id``; ``QuotaExceeded`` (429) past the limit."""
        if not self.per_minute:
            return
        now = time.time() if now is None else now
        window = int(now // WINDOW_S)
        count = self._count(tenant_id, window)
        if count is not None and count > self.per_minute:
            retry_after = max(1, int((window + 1) * WINDOW_S - now) + 1)
            raise QuotaExceeded(
                f"This tenant submitted more than {self.per_minute} jobs in the last minute "
                f"(FLEXDSA_SUBMIT_RATE_PER_MINUTE); retry in {retry_after} s.",
                code="rate_limited",
                details={"limit_per_minute": self.per_minute, "retry_after_s": retry_after},
                headers={"Retry-After": str(retry_after)},
            )

    def _count(self, tenant_id: int, window: int) -> int | None:
        if self.redis is not None:
            key = f"flexdsa:rate:{tenant_id}:{window}"
            try:
                pipe = self.redis.pipeline()
                pipe.incr(key)
                pipe.expire(key, WINDOW_S * 2)
                return int(pipe.execute()[0])
            except Exception as err:  # Redis down: no rate limit rather than no service
                log.warning("rate limit not enforced: Redis unavailable (%s)", err)
                return None
        with self._lock:
            for stale in [k for k in self._counts if k[1] < window]:
                del self._counts[stale]
            self._counts[tenant_id, window] = self._counts.get((tenant_id, window), 0) + 1
            return self._counts[tenant_id, window]
