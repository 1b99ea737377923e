"""Run a script in the oracle venv (.venv-oracle, NVIDIA nemo-automodel) on tensors.

The project venv cannot import the oracle, so tests hand it tensors through safetensors
files. The script runs as `.venv-oracle/bin/python SCRIPT IN OUT`: it reads its inputs
from the safetensors file sys.argv[1] and writes its outputs to sys.argv[2], e.g.

    import sys
    from safetensors.torch import load_file, save_file
    inputs = load_file(sys.argv[1])
    ...
    save_file({"y": y.contiguous()}, sys.argv[2])

A missing oracle venv is an error (tests that need it fail, never skip).
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

REPO_ROOT = Path(__file__).resolve().parents[1]
ORACLE_PYTHON = REPO_ROOT / ".venv-oracle" / "bin" / "python"


class OracleError(RuntimeError):
    """The oracle venv is missing or the oracle script failed."""


def run_oracle(
    script: str | Path, inputs: dict[str, torch.Tensor], *, timeout_s: float = 300.0
) -> dict[str, torch.Tensor]:
    """Run `script` (source text, or a Path to a .py file) in the oracle venv on `inputs`."""
    if not ORACLE_PYTHON.exists():
        raise OracleError(f"oracle venv missing ({ORACLE_PYTHON}); run scripts/setup.sh to create .venv-oracle")
    with tempfile.TemporaryDirectory(prefix="oracle-") as tmp:
        tmp_dir = Path(tmp)
        if isinstance(script, Path):
            script_path = script
        else:
            script_path = tmp_dir / "oracle_script.py"
            script_path.write_text(script)
        in_path, out_path = tmp_dir / "inputs.safetensors", tmp_dir / "outputs.safetensors"
        save_file({name: t.detach().cpu().contiguous() for name, t in inputs.items()}, str(in_path))
        env = {**os.environ, "TORCHDYNAMO_DISABLE": "1", "PYTHONDONTWRITEBYTECODE": "1"}
        env.pop("PYTHONPATH", None)  # keep the project's packages out of the oracle
        try:
            proc = subprocess.run(
                [str(ORACLE_PYTHON), str(script_path), str(in_path), str(out_path)],
                cwd=tmp_dir,
                env=env,
                capture_output=True,
                text=True,
                timeout=timeout_s,
            )
        except subprocess.TimeoutExpired as exc:
            raise OracleError(f"oracle script timed out after {timeout_s} s") from exc
        if proc.returncode != 0:
            raise OracleError(f"oracle script exited with {proc.returncode}:\n{proc.stderr[-4000:]}")
        if not out_path.exists():
            raise OracleError(f"oracle script wrote no outputs to {out_path}:\n{proc.stderr[-4000:]}")
        return load_file(str(out_path))

