"""Any OpenAI-compatible completions server over HTTP (:mod:`.backend`, :mod:`.client`)."""
