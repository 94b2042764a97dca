"""Test support that the tests and the benchmarks share (neither imports the other): synthetic
runs audited by the real audit (:mod:`~kvaudit.testing.synthetic`, :mod:`~kvaudit.testing.synthetic_repairs`),
real servers on free local ports (:mod:`~kvaudit.testing.served`, :mod:`~kvaudit.testing.vllm_server`), the example dataset edited (:mod:`~kvaudit.testing.example_dataset`),
`kvaudit` processes forked with vLLM already imported (:mod:`~kvaudit.testing.prewarmed`)
and the readers' fuzzing harness (:mod:`~kvaudit.testing.fuzz_readers`). Nothing in kvaudit's
commands imports it (the layering contract keeps it on top)."""
