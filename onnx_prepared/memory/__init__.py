"""Memory: the one ledger. The allocation domains, the session's arenas and the byte budget.

``domains`` (the :class:`Domain` enum every other module uses), ``arenas`` (live/retained bytes per
domain of one session), ``budget`` (the scheduler's global byte budget and per-domain limits).
"""

from onnx_prepared.memory.arenas import Allocation, Arena, ArenaLimitError, Arenas
from onnx_prepared.memory.budget import UNLIMITED, MemoryBudget
from onnx_prepared.memory.domains import Domain

__all__ = ["UNLIMITED", "Allocation", "Arena", "ArenaLimitError", "Arenas", "Domain", "MemoryBudget"]
