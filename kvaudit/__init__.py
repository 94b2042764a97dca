"""kvaudit: measure what non-prefix (segment) KV-cache reuse costs in quality and buys in speed."""

__version__ = "0.1.0"
