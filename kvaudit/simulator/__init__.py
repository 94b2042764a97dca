"""Cache simulator: prefix (vLLM block hash chain) vs segment (content-addressed) KV caching.

Modules: ``trace`` (request JSONL format and validation), ``kv_bytes`` (KV bytes per token),
``prefix_cache`` and ``segment_cache`` (the two policies), ``hit_rate`` (the token hit rate
definition shared with the runner and report), ``engine`` (policies x capacities, cold/warm,
windows), ``plots`` and ``simulate_cli`` (``kvaudit simulate``).
"""
