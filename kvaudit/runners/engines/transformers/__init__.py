"""Hugging Face transformers, in process: the default engine (:mod:`.backend`)."""
