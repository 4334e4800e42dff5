"""Memory: the allocation domains (arenas) the scheduler admits work against."""

from onnx_prepared.memory.arenas import DOMAINS, Allocation, Arena, ArenaLimitError, Arenas

__all__ = ["DOMAINS", "Allocation", "Arena", "ArenaLimitError", "Arenas"]
