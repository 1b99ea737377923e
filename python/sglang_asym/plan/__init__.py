"""Sizing asymmetric PD pools for DeepSeek-V4.1-Flash: prefill share, layouts, step-time models, a simulator
driving the real decode scheduler, and the planner (`python -m sglang_asym.plan`)."""
