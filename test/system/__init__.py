"""System tests: real server processes, the real router, on 127.0.0.1."""
