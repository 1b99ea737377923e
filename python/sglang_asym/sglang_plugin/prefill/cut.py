"""The prefill role's intake cut: an asym-prefill server computes only tokens [0, B) of a prompt.

B is the core's `SplitPlan(cfg, N, W, semantics).boundary` (N - W, 0 when N <= W); this module
only applies it to a SGLang request. `cut_request` shortens the request's prompt (SGLang's
`Req.origin_input_ids`, its unpadded copy and the fill ids derived from them) to its first B tokens
before SGLang sizes the KV transfer, checks capacity or schedules the prefill, so SGLang's own
prefill computes [0, B), its own sender ships the pages covering [0, B) and the registration of
shared/pd_registration.py narrows that to the payload. The full prompt length stays on the request
(`prompt_len_of`) for logs and checks.

A prompt with N <= W has nothing to compute on P (`PrefillCut.runs_forward` is False): it is cut to
no tokens, and zero.py concludes it without a forward.
Nothing here imports SGLang; the request is duck-typed on the Req fields named above.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...config import V41Config
from ...split import SplitPlan
from ..shared.request_record import note, request_record
from ..shared.settings import AsymSettings

class PrefillCutError(ValueError):
    """A request that cannot be cut (already cut, already computed, or an empty prompt)."""


@dataclass(frozen=True)
class PrefillCut:
    """What the prefill role computes of one prompt: tokens [0, boundary) of prompt_len."""

    prompt_len: int
    boundary: int

    @property
    def runs_forward(self) -> bool:
        """False when N <= W: no layer runs on P and the payload is empty."""
        return self.boundary > 0


def prefill_cut_for(cfg: V41Config, settings: AsymSettings, prompt_len: int) -> PrefillCut:
    """The cut of a prompt of `prompt_len` tokens for an asym-prefill server's settings."""
    if not settings.is_prefill:
        raise PrefillCutError(f"only the asym-prefill role cuts requests, this server is {settings.mode}")
    split = SplitPlan(cfg, prompt_len, settings.window, settings.semantics)
    split.require_splittable()
    return PrefillCut(prompt_len, split.boundary)


def prompt_len_of(req: Any) -> int | None:
    """The prompt length a cut request had before the cut, None for a request never cut."""
    return request_record(req).prompt_len


def cut_request(req: Any, cut: PrefillCut) -> None:
    """Shortens a fresh SGLang request's prompt to the cut's first `boundary` tokens, in place.

    Refuses a request that was cut before (a retried request keeps its first cut), one that already
    produced output or was scheduled, and a cut whose prompt length is not the request's."""
    if prompt_len_of(req) is not None:
        raise PrefillCutError(f"request {req.rid} was already cut to {len(req.origin_input_ids)} tokens")
    ids = req.origin_input_ids
    if len(ids) != cut.prompt_len:
        raise PrefillCutError(f"request {req.rid} has {len(ids)} prompt tokens, the cut was made for {cut.prompt_len}")
    if len(req.output_ids) or req.extend_end is not None:
        raise PrefillCutError(f"request {req.rid} was already scheduled; only a fresh request can be cut")
    unpadded = req.origin_input_ids_unpadded
    if unpadded is not ids and len(unpadded) != len(ids):
        # a multimodal request pads its prompt; a text-only V4.1 server never sees one
        raise PrefillCutError(f"request {req.rid} has a padded prompt ({len(unpadded)} unpadded tokens); "
                              "the asymmetric split is defined on text prompts only")
    kept = ids[:cut.boundary]  # same sequence type (SGLang's array('q'))
    req.origin_input_ids = kept
    req.origin_input_ids_unpadded = kept
    req.full_untruncated_fill_ids = kept[:0]  # rebuilt from the cut origin by refresh_fill_ids
    if getattr(req, "logprob_start_len", -1) > cut.boundary:  # "output tokens only" was set as N
        req.logprob_start_len = cut.boundary
    note(req, prompt_len=cut.prompt_len)
