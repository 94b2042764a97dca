"""The engines kvaudit runs cases on, one room each: ``transformers`` (in process, the default),
``vllm`` (in process, with kvaudit's KV connector) and ``http`` (any OpenAI-compatible server).
Each implements :class:`kvaudit.runners.backend.Backend` and is opened by name through
:mod:`kvaudit.runners.registry`; an engine imports the engine-neutral modules beside this package
(prompt, RoPE, store, backend) and never another engine (import-linter keeps them apart)."""
