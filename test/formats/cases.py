"""Named float32 input tensors that exercise the formats' edge cases (deterministic)."""

from __future__ import annotations

import torch

from .reference import E2M1_GRID, E4M3_GRID


def _midpoints(grid: list[tuple[int, float]]) -> list[float]:
    values = [v for _, v in grid]
    return [(a + b) / 2 for a, b in zip(values, values[1:])]


def _next_up(x: float) -> float:
    return torch.nextafter(torch.tensor(x), torch.tensor(float("inf"))).item()


def _next_down(x: float) -> float:
    return torch.nextafter(torch.tensor(x), torch.tensor(float("-inf"))).item()


def _rows(values: list[float], width: int, lead: float, period: int = 8) -> torch.Tensor:
    """Rows of `width` holding `values`, with `lead` at every multiple of `period`.

    Every group of a block size that is a multiple of `period` then contains `lead`,
    which fixes that group's scale.
    """
    flat: list[float] = []
    for value in values:
        if len(flat) % period == 0:
            flat.append(lead)
        flat.append(value)
    while len(flat) % width:
        flat.append(lead if len(flat) % period == 0 else 0.0)
    return torch.tensor(flat, dtype=torch.float32).reshape(-1, width)


def grid_rows(width: int) -> torch.Tensor:
    """Every e2m1 and e4m3 level and midpoint (+-, and +-1 ulp), at scale 1.

    Groups are led by 6.0 (fp4 formats: scale 1) or by 448.0 (fp8: scale 1), so the
    values land on the element grids exactly: each midpoint is a rounding tie.
    """
    out = []
    for lead, grid in ((6.0, E2M1_GRID), (448.0, E4M3_GRID)):
        points = [v for _, v in grid] + _midpoints(grid)
        points += [_next_up(p) for p in points] + [_next_down(p) for p in points if p > 0]
        points += [-p for p in points]
        out.append(_rows(points, width, lead))
    return torch.cat(out)


def input_cases(width: int = 64) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1234)
    decades = torch.logspace(-30, 30, 16, dtype=torch.float64).float().unsqueeze(1)
    special = torch.tensor(
        [
            [0.0] * width,  # all-zero row
            [-0.0] * width,  # negative zeros keep their sign
            [1e-40, -1e-42, 1e-45, 3e-39] + [0.0] * (width - 4),  # float32 subnormals only
            [1e-5, -3e-6] + [2e-7] * (width - 2),  # amax under the fp8 floor (1e-4)
            [1e-3, 1e-9, -1e-12, 1e-20] * (width // 4),  # small elements underflow the group
            [448.0, 448 * 1.0001, 447.9, -449.0] * (width // 4),  # scale boundaries near 448
            [6.0, 6.0001, 5.9999, -6.0] * (width // 4),  # scale boundaries near 6
            [2688.0, 2784.0, -1e4, 1e30] * (width // 4),  # nvfp4 scale saturation
            [3e36, -1e37, 2.0, 1e38] * (width // 4),  # very large, still finite after rounding
        ],
        dtype=torch.float32,
    )
    return {
        "gauss": torch.randn(16, width, generator=g) * decades,  # one decade per row
        "uniform": (torch.rand(8, width, generator=g) * 14 - 7) * 2.0 ** torch.arange(-4, 4).unsqueeze(1),
        "special": special,
        "grid": grid_rows(width),
        "partial": torch.randn(4, width - 27, generator=g),  # last group partial at every block size
        "short": torch.randn(3, 5, generator=g) * 100,  # fewer channels than one block
        "leading_dims": torch.randn(2, 3, width, generator=g),
    }
