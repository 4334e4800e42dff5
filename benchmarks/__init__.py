"""Side-by-side benchmarks; each module runs as ``python -m benchmarks.NAME`` or ``python benchmarks/NAME.py``."""
