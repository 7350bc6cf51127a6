"""mimo_ctx benchmarks: hot path, rebuild, token counting and replay quality (issue 9).

Run them with ``python benchmarks/run_all.py`` (or ``mimo-ctx bench``); see
``benchmarks/README.md`` and the latest figures in ``benchmarks/RESULTS.md``.
"""
