"""driftscope benchmarks: `python -m benchmarks.run [--smoke] [--sizes ...]` (docs/performance.md)."""
