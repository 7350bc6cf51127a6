"""mimo_ctx benchmarks: hot path, rebuild, token counting and replay quality.

Run them with ``python benchmarks/run_all.py`` (or ``python -m benchmarks.run_all``); see
``benchmarks/README.md`` and the latest figures in ``benchmarks/RESULTS.md``.
"""
