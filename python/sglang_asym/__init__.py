"""sglang-asym: asymmetric prefill/decode disaggregation for DeepSeek-V4.1-Flash."""

__version__ = "0.1.0"
