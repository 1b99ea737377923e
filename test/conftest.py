"""Shared test setup: one torch thread per test process (CI has 2 cores; oversubscription makes
small-tensor CPU work tens of times slower), and shared model fixtures."""

from __future__ import annotations

import torch

torch.set_num_threads(1)
