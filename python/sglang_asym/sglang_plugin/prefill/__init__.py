"""What the prefill role (asym-prefill, P) adds to SGLang: the intake cut to B = N - W, the truncated model and
its cut layer loop, the zero-compute and stopped-room paths, and the exact-payload KV manager."""
