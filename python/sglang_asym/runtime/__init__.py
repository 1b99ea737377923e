"""The embedded runtime: engines (prefill worker, decode worker, colocated model), the SGLang-compatible
HTTP front (`runtime.http`), the engine boundary between them (`runtime.engine_api`) and the router launcher."""
