"""vLLM, in process or as a server, with kvaudit's KV connector (:mod:`.connector`) serving segment KV."""
