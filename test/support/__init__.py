"""Test support shared by test directories and benchmarks (not shipped): the loopback transfer harness.

  loopback_rpc     run an agent object in a spawned child process, call its methods over a pipe
  loopback_common  picklable manifests, a deterministic row pattern, fragmented allocators, polling
  loopback_agents  a prefill and a decode worker agent over a real Mooncake engine on 127.0.0.1

Importable as `support.*` with `test/` on sys.path (pytest's pythonpath; scripts insert it). Spawned agents
inherit the parent's sys.path.
"""
