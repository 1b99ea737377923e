"""The CPU route's fp4 index-key store (cpu_ops.store_fp4_index_k_in_torch) against SGLang's own Triton kernels
(`store_fp4_index_k_cache`: `quantize_fp4_indexer_tensor`, then the paged store) under Triton's CPU interpreter,
in a fresh process (TRITON_INTERPRET must be set before Triton is imported). Prints one line `REPORT <json>`.

    TRITON_INTERPRET=1 python test/sglang_plugin/index_k_store_checks.py
"""

from __future__ import annotations

import json

import torch

PAGE = 16
ROWS = 40  # the interpreter runs one Python program per row: a few dozen rows take seconds
BOUNDARIES = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0)


def cases() -> dict[str, torch.Tensor]:
    """Index-key rows [ROWS, 128] that reach every branch of the quantizer."""
    g = torch.Generator().manual_seed(3)
    normal = torch.randn(ROWS, 128, generator=g)
    scaled = normal * torch.logspace(-6, 3, ROWS).unsqueeze(1)  # group maxima from below the 1e-4 floor to large
    # exact e2m1 boundaries and their negatives at a scale of 1 (each group's maximum 6 sets the exponent to 0)
    edges = torch.tensor(BOUNDARIES + tuple(-b for b in BOUNDARIES) + (0.0, -0.0)).repeat(ROWS, 8)[:, :128].clone()
    edges[:, ::32] = 6.0
    # the boundaries at a scale of 2 ** -3 (group maximum 0.75: the scale's exponent rounds up from 0.125)
    eighths = edges / 8
    zeros = torch.zeros(ROWS, 128)
    zeros[::2] = -0.0
    tiny = torch.randn(ROWS, 128, generator=g) * 1e-7  # below the 1e-4 scale floor: codes of values ~0
    return {"scaled": scaled, "edges": edges, "eighths": eighths, "zeros": zeros, "tiny": tiny,
            "bf16": scaled.to(torch.bfloat16)}


def main() -> None:
    from sglang_on_cpu import sglang_cpu_context

    with sglang_cpu_context():
        from sglang.kernels.ops.kvcache.dsv4_fp4_index_k_cache import store_fp4_index_k_cache

        from sglang_asym.sglang_plugin.cpu_platform.cpu_ops import store_fp4_index_k_in_torch

        pages = -(-ROWS // PAGE) + 2
        loc = torch.randperm(pages * PAGE, generator=torch.Generator().manual_seed(5))[:ROWS]
        report, written = {}, {}
        for name, rows in cases().items():
            for rne in (False, True):
                theirs = torch.zeros(pages, PAGE * 68, dtype=torch.uint8)
                ours = torch.zeros_like(theirs)
                store_fp4_index_k_cache(rows, theirs, loc, page_size=PAGE, rne=rne)
                store_fp4_index_k_in_torch(rows, ours, loc, page_size=PAGE, rne=rne)
                report[f"{name}/{'rne' if rne else 'thresholds'}"] = {
                    "differing_bytes": int((theirs != ours).sum()), "written_bytes": int((theirs != 0).sum())}
                written[name, rne] = theirs
        # the two roundings part exactly at the boundaries: the cases reach both
        report["rne_vs_thresholds_bytes"] = {name: int((written[name, True] != written[name, False]).sum())
                                             for name in ("edges", "eighths", "scaled")}
    print("REPORT " + json.dumps(report))


if __name__ == "__main__":
    main()
