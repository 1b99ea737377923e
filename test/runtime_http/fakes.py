"""Test doubles for the HTTP front: a tiny byte-level BPE checkpoint and a deterministic engine.

FakeEngine answers every prompt with the tokens of f"{len(prompt)}:{reply}" followed by EOS (or the
reply repeated when ignore_eos), `tokens_per_event` tokens per event. As a prefill-role engine it
yields no tokens: one final `length 0` event after a simulated transfer, like SGLang's P.
"""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path
from typing import AsyncIterator

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from sglang_asym.runtime.engine_api import (
    BootstrapRoomInUseError,
    EngineError,
    EngineRole,
    FinishReason,
    GenerateRequest,
    TokenEvent,
)
from sglang_asym.runtime.http.tokenizer import TextTokenizer
from sglang_asym.runtime.metrics import EngineMetrics, QueueName

BOS, EOS = "<|bos|>", "<|eos|>"
REPLY = "Hello wörld ✓"  # multi-byte characters split across byte tokens exercise the detokenizer
_CORPUS = ["hello world", "the quick brown fox jumps over the lazy dog", "Hello there, general", "ab " * 20,
           "user assistant system", "wörld"]


def write_tiny_checkpoint(root: Path) -> Path:
    """tokenizer.json (byte-level BPE, ~300 tokens, BOS=0, EOS=1) + tokenizer_config.json, no chat template."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=[BOS, EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(_CORPUS, trainer)
    root.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(root / "tokenizer.json"))
    (root / "tokenizer_config.json").write_text(f'{{"bos_token": "{BOS}", "eos_token": "{EOS}"}}')
    return root


class FakeEngine:
    def __init__(self, tokenizer: TextTokenizer, role: EngineRole = EngineRole.COLOCATED, *,
                 max_context_length: int = 256, tokens_per_event: int = 1, token_delay_s: float = 0.0,
                 transfer_delay_s: float = 0.0, name: str = "fake") -> None:
        self.tokenizer = tokenizer
        self._role = role
        self._max_context_length = max_context_length
        self.tokens_per_event = tokens_per_event
        self.token_delay_s = token_delay_s
        self.transfer_delay_s = transfer_delay_s
        self._metrics = EngineMetrics(name, role.value)
        self.eos_id = tokenizer.eos_token_ids[0]
        self.requests: list[GenerateRequest] = []
        self.aborted: list[str] = []
        self.used_rooms: set[int] = set()
        self.refuse_with: EngineError | None = None  # raised by the next generate() calls
        self.refuse_after_s = 0.0  # ... after this long (a P that fails late, once D's copy is running)
        self.fail_after_tokens: int | None = None  # report an error event after this many tokens
        self.healthy = True
        self._abort_flags: dict[str, asyncio.Event] = {}

    role = property(lambda self: self._role)
    max_context_length = property(lambda self: self._max_context_length)
    metrics = property(lambda self: self._metrics)

    def reply_ids(self, prompt_len: int) -> list[int]:
        return self.tokenizer.encode(f"{prompt_len}:{REPLY}")

    async def generate(self, req: GenerateRequest) -> AsyncIterator[TokenEvent]:
        self.requests.append(req)
        if self.refuse_with is not None:
            await asyncio.sleep(self.refuse_after_s)
            raise self.refuse_with
        if req.bootstrap is not None and not req.bootstrap.is_health_probe:
            if req.bootstrap.room in self.used_rooms:
                raise BootstrapRoomInUseError(f"bootstrap_room {req.bootstrap.room} is already in use")
            self.used_rooms.add(req.bootstrap.room)
        aborted = self._abort_flags[req.rid] = asyncio.Event()
        self._metrics.set_queue_size(QueueName.RUNNING, len(self._abort_flags))
        try:
            if self._role is EngineRole.PREFILL:
                if await self._wait(aborted, self.transfer_delay_s):
                    yield TokenEvent(req.rid, (), True, FinishReason.abort())
                    return
                self._metrics.observe_transfer(100 * len(req.input_ids), self.transfer_delay_s)
                yield TokenEvent(req.rid, (), True, FinishReason.of_length(0), meta={"transferred_tokens": len(req.input_ids)})
                return
            async for event in self._decode(req, aborted):
                yield event
        finally:
            del self._abort_flags[req.rid]

    async def _decode(self, req: GenerateRequest, aborted: asyncio.Event) -> AsyncIterator[TokenEvent]:
        sampling, reply = req.sampling, self.reply_ids(len(req.input_ids))
        tokens = itertools.cycle(reply) if sampling.ignore_eos else iter([*reply, self.eos_id])
        stops = set(sampling.stop_token_ids) | (set() if sampling.ignore_eos else {self.eos_id})
        chunk: list[int] = []
        for count in itertools.count():
            finish = None
            if count == sampling.max_new_tokens:
                finish = FinishReason.of_length(count)
            elif self.fail_after_tokens is not None and count == self.fail_after_tokens:
                yield TokenEvent(req.rid, tuple(chunk), True, FinishReason.abort("decode worker lost"),
                                 error="decode worker lost")
                return
            else:
                token = next(tokens)
                chunk.append(token)
                if token in stops:
                    finish = FinishReason.stop(token)
            if finish is not None or len(chunk) == self.tokens_per_event:
                if await self._wait(aborted, self.token_delay_s):
                    yield TokenEvent(req.rid, tuple(chunk), True, FinishReason.abort())
                    return
                yield TokenEvent(req.rid, tuple(chunk), finish is not None, finish, meta={"cached_tokens": 0})
                chunk = []
            if finish is not None:
                return

    @staticmethod
    async def _wait(aborted: asyncio.Event, delay_s: float) -> bool:
        """Sleep delay_s unless aborted first; True when aborted."""
        if delay_s > 0:
            try:
                await asyncio.wait_for(aborted.wait(), delay_s)
            except TimeoutError:
                pass
        return aborted.is_set()

    async def abort(self, rid: str) -> None:
        self.aborted.append(rid)
        flag = self._abort_flags.get(rid)
        if flag is not None:
            flag.set()

    def model_info(self) -> dict:
        return {"model_type": "deepseek_v41", "architectures": ["DeepseekV41ForCausalLM"],
                "eos_token_ids": list(self.tokenizer.eos_token_ids)}

    def server_info(self) -> dict:
        return {"max_running_requests": 8, "page_size": 64,
                **({"disaggregation_bootstrap_port": 18998} if self._role is EngineRole.PREFILL else {})}

    def health(self) -> bool:
        return self.healthy
