"""MemoryBudget: one global byte budget with per-domain limits, the ledger admission decides against.

The budget only counts bytes; it allocates nothing. Counters change in exactly two places,
:meth:`MemoryBudget.acquire` and :meth:`MemoryBudget.release`, so an audit hook on those two calls sees
every change (tests use it to prove limits hold at every instant). The scheduler's admission
(:mod:`onnx_prepared.scheduler.admission`) is its only caller.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from onnx_prepared.errors import InternalError
from onnx_prepared.memory.domains import Domain

#: "No limit": large enough that no sum of real byte counts reaches it, still an int (fast compares).
UNLIMITED = 1 << 62


class MemoryBudget:
    """One global byte budget, per-domain limits and a slice reserved for critical work.

    Admission rule (:meth:`fits`): a charge is admitted when it fits under every limit that applies,
    where the global limit is ``total`` for critical work and ``total - critical_reserve`` for prefetch
    and background work, and each domain has its own limit (minus its ``domain_reserve`` for
    non-critical work, so background work in a domain shared with critical work cannot fill it).
    A charge larger than a limit on its own counts as exactly that limit, so it is admitted once
    nothing else holds bytes under that limit (it then runs alone and may exceed the limit by its own
    size) instead of waiting forever.

    Not thread-safe: the scheduler calls every method under its lock.
    """

    def __init__(
        self,
        total: int | None = None,
        *,
        limits: Mapping[Domain, int] | None = None,
        critical_reserve: int = 0,
        domain_reserve: Mapping[Domain, int] | None = None,
        audit: Callable[[str, Domain, int, bool, MemoryBudget], None] | None = None,
    ):
        self.total = UNLIMITED if total is None else int(total)
        if self.total < 0 or critical_reserve < 0:
            raise ValueError("memory budget and reserve must be non-negative")
        if critical_reserve and critical_reserve >= self.total:
            raise ValueError(f"critical_reserve ({critical_reserve}) must be smaller than total ({self.total})")
        self.critical_reserve = int(critical_reserve)
        self._limits: dict[Domain, int] = dict.fromkeys(Domain, UNLIMITED)
        for d, v in (limits or {}).items():
            if not isinstance(d, Domain) or int(v) < 0:
                raise ValueError(f"bad domain limit {d!r}: {v!r}")
            self._limits[d] = int(v)
        self._reserve: dict[Domain, int] = dict.fromkeys(Domain, 0)
        for d, v in (domain_reserve or {}).items():
            if not isinstance(d, Domain) or not 0 <= int(v) < self._limits[d]:
                raise ValueError(f"bad domain reserve {d!r}: {v!r} (must be below the domain limit)")
            self._reserve[d] = int(v)
        self._used: dict[Domain, int] = dict.fromkeys(Domain, 0)
        self.used_total = 0
        #: Called after every acquire/release as ``audit(event, domain, nbytes, critical, budget)``.
        self.audit = audit

    def limit(self, domain: Domain | None = None, *, critical: bool = True) -> int:
        """The limit that applies to the priority class: the global one, or ``domain``'s."""
        if domain is not None:
            return self._limits[domain] - (0 if critical else self._reserve[domain])
        return self.total if critical else self.total - self.critical_reserve

    def used(self, domain: Domain | None = None) -> int:
        return self.used_total if domain is None else self._used[domain]

    def fits(self, domain: Domain, nbytes: int, critical: bool) -> bool:
        g = self.total if critical else self.total - self.critical_reserve
        if self.used_total + min(nbytes, g) > g:
            return False
        d = self._limits[domain] if critical else self._limits[domain] - self._reserve[domain]
        return self._used[domain] + min(nbytes, d) <= d

    def oversized(self, domain: Domain, nbytes: int, critical: bool) -> bool:
        """True when ``nbytes`` alone exceeds a limit that applies (the task then runs alone)."""
        return nbytes > self.limit(critical=critical) or nbytes > self.limit(domain, critical=critical)

    def acquire(self, domain: Domain, nbytes: int, critical: bool) -> None:
        """Charge ``nbytes`` (the only place counters grow). The caller checked :meth:`fits`."""
        self._used[domain] += nbytes
        self.used_total += nbytes
        if self.audit is not None:
            self.audit("acquire", domain, nbytes, critical, self)

    def release(self, domain: Domain, nbytes: int) -> None:
        """Return ``nbytes`` (the only place counters shrink)."""
        used = self._used[domain] - nbytes
        if used < 0 or nbytes < 0:
            raise InternalError(f"memory domain {domain.value!r} released {nbytes} bytes but held {used + nbytes}")
        self._used[domain] = used
        self.used_total -= nbytes
        if self.audit is not None:
            self.audit("release", domain, nbytes, False, self)

    def snapshot(self) -> dict[str, int]:
        """``{"total": used, "<domain>": used, ...}`` (call under the owner's lock for consistency)."""
        out = {"total": self.used_total}
        out.update({d.value: v for d, v in self._used.items()})
        return out
