"""OpenAI `/v1/completions` and `/v1/chat/completions` bodies -> admitted requests.

Field names follow SGLang's OpenAI protocol (its extensions included: top_k, min_p, stop_token_ids,
ignore_eos, no_stop_trim, skip_special_tokens, rid, the router's bootstrap fields). Unknown fields are
ignored, as SGLang's pydantic models do; implemented-elsewhere features are refused when switched on.
`max_tokens` defaults to 16 for completions; a chat request without `max_completion_tokens` /
`max_tokens` may use the rest of the context.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sglang_asym.runtime.http.chat_template import normalize_messages, render_chat
from sglang_asym.runtime.http.errors import ApiError
from sglang_asym.runtime.http.fields import parse_bootstraps, parse_rids
from sglang_asym.runtime.http.native_api import check_token_ids
from sglang_asym.runtime.http.runner import AdmittedRequest, RequestRunner
from sglang_asym.runtime.http.sampling import ParsedSampling, parse_sampling

COMPLETIONS_DEFAULT_MAX_TOKENS = 16
_TO_SGLANG = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
              "frequency_penalty": "frequency_penalty", "presence_penalty": "presence_penalty",
              "repetition_penalty": "repetition_penalty", "stop": "stop", "stop_token_ids": "stop_token_ids",
              "ignore_eos": "ignore_eos", "skip_special_tokens": "skip_special_tokens",
              "no_stop_trim": "no_stop_trim", "seed": "sampling_seed", "regex": "regex", "ebnf": "ebnf",
              "json_schema": "json_schema", "n": "n", "logit_bias": "logit_bias"}
_UNSUPPORTED_WHEN_SET = ("echo", "logprobs", "top_logprobs", "suffix", "response_format", "tools",
                         "return_hidden_states", "return_routed_experts", "lora_path", "session_params",
                         "custom_logit_processor", "continue_final_message", "min_tokens", "chat_template_kwargs")


@dataclass(frozen=True)
class OpenAIJob:
    requests: tuple[AdmittedRequest, ...]
    model: str
    stream: bool
    include_usage: bool
    continuous_usage: bool


def _common(body: dict[str, Any]) -> tuple[bool, bool, bool]:
    for key in _UNSUPPORTED_WHEN_SET:
        if body.get(key):
            raise ApiError.bad_request(f"{key} is not supported by this runtime", param=key)
    if body.get("best_of") not in (None, 1):
        raise ApiError.bad_request("best_of is not supported by this runtime", param="best_of")
    stream = body.get("stream") or False
    if not isinstance(stream, bool):
        raise ApiError.bad_request(f"stream must be a boolean, got {stream!r}", param="stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise ApiError.bad_request("stream_options must be an object", param="stream_options")
    return stream, bool(options.get("include_usage")), bool(options.get("continuous_usage_stats"))


def _sampling(body: dict[str, Any], max_tokens: Any) -> ParsedSampling:
    raw = {sg: body[oa] for oa, sg in _TO_SGLANG.items() if body.get(oa) is not None}
    raw["max_new_tokens"] = max_tokens
    return parse_sampling(raw, where="request")


def _model(body: dict[str, Any], served_model_name: str) -> str:
    model = body.get("model")
    return model if isinstance(model, str) and model else served_model_name


def _job(body: dict[str, Any], runner: RequestRunner, prompts: list[list[int]], batch: bool,
         sampling: ParsedSampling, served_model_name: str) -> OpenAIJob:
    stream, include_usage, continuous_usage = _common(body)
    n = len(prompts)
    rids, bootstraps = parse_rids(body, n, batch), parse_bootstraps(body, n, batch)
    admitted = tuple(runner.admit(rid, ids, sampling, stream, boot)
                     for rid, ids, boot in zip(rids, prompts, bootstraps))
    return OpenAIJob(admitted, _model(body, served_model_name), stream, include_usage, continuous_usage)


def parse_completion(body: dict[str, Any], runner: RequestRunner, served_model_name: str) -> OpenAIJob:
    prompt = body.get("prompt")
    vocab = runner.tokenizer.vocab_size
    if isinstance(prompt, str):
        if not prompt:
            raise ApiError.bad_request("prompt is empty", param="prompt")
        prompts, batch = [runner.tokenizer.encode(prompt)], False
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        if not all(prompt):
            raise ApiError.bad_request("prompt holds an empty string", param="prompt")
        prompts, batch = [runner.tokenizer.encode(p) for p in prompt], True
    elif isinstance(prompt, list) and prompt and all(isinstance(p, list) for p in prompt):
        prompts, batch = [check_token_ids(p, vocab, "prompt") for p in prompt], True
    elif isinstance(prompt, list) and prompt:
        prompts, batch = [check_token_ids(prompt, vocab, "prompt")], False
    else:
        raise ApiError.bad_request("prompt must be a non-empty string, list of strings, list of token ids, or "
                                   "list of token-id lists", param="prompt")
    max_tokens = body.get("max_tokens", COMPLETIONS_DEFAULT_MAX_TOKENS)
    return _job(body, runner, prompts, batch, _sampling(body, max_tokens), served_model_name)


def parse_chat(body: dict[str, Any], runner: RequestRunner, served_model_name: str) -> OpenAIJob:
    tokenizer = runner.tokenizer
    input_ids = body.get("input_ids")
    if input_ids is not None:  # SGLang extension: a pre-tokenized chat prompt
        prompt_ids = check_token_ids(input_ids, tokenizer.vocab_size, "input_ids")
    else:
        messages = normalize_messages(body.get("messages"))
        text = render_chat(messages, tokenizer.chat_template, tokenizer.bos_token, tokenizer.eos_token)
        prompt_ids = tokenizer.encode(text, add_special_tokens=False)  # the template places BOS itself
    max_tokens = body.get("max_completion_tokens")
    if max_tokens is None:
        max_tokens = body.get("max_tokens")
    return _job(body, runner, [prompt_ids], False, _sampling(body, max_tokens), served_model_name)
