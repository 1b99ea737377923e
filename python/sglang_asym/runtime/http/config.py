"""HttpServerConfig: what the HTTP front needs to know about where and what it serves."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HttpServerConfig:
    model_path: str  # reported by /model_info; the routers load the tokenizer from it when it is a local dir
    tokenizer_path: str | None = None  # defaults to model_path
    served_model_name: str | None = None  # defaults to model_path
    host: str = "127.0.0.1"
    port: int = 30000  # 0 picks a free port (tests)
    health_generate_timeout_s: float = 20.0  # SGLang's HEALTH_CHECK_TIMEOUT
    drain_timeout_s: float = 30.0  # on SIGTERM, running requests get this long to finish before an abort

    def __post_init__(self) -> None:
        if not self.model_path:
            raise ValueError("HttpServerConfig.model_path must be set")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        if self.health_generate_timeout_s <= 0:
            raise ValueError(f"health_generate_timeout_s must be > 0, got {self.health_generate_timeout_s}")
        if self.drain_timeout_s < 0:
            raise ValueError(f"drain_timeout_s must be >= 0, got {self.drain_timeout_s}")

    @property
    def served_name(self) -> str:
        return self.served_model_name or self.model_path

    @property
    def tokenizer_dir(self) -> str:
        return self.tokenizer_path or self.model_path
