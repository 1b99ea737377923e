"""A streamed greedy /generate as a client sees it (time to first token, gaps between tokens), and Prometheus
totals from a server's /metrics: the client side of the serving benchmarks on SGLang's engine."""

from __future__ import annotations

import json
import time
import urllib.request
from dataclasses import dataclass, field


@dataclass
class StreamRecord:
    """One streamed request (perf_counter seconds); `error` says why it did not complete."""

    prompt_tokens: int
    sent_at: float
    token_times: list[float] = field(default_factory=list)  # one entry per output token
    error: str | None = None

    @property
    def ttft(self) -> float | None:
        return self.token_times[0] - self.sent_at if self.token_times else None

    def itl(self) -> list[float]:
        return [b - a for a, b in zip(self.token_times, self.token_times[1:])]


def token_times(chunks: list[tuple[float, int]]) -> list[float]:
    """(arrival time, cumulative completion tokens) per SSE chunk -> one time per token; k tokens in one chunk
    are spread evenly over the gap since the previous chunk."""
    times: list[float] = []
    last_time, last_count = None, 0
    for t, count in chunks:
        new = count - last_count
        if new <= 0:
            continue
        if last_time is None:
            times += [t] * new
        else:
            times += [last_time + (t - last_time) * (i + 1) / new for i in range(new)]
        last_time, last_count = t, count
    return times


def stream_request(url: str, ids: list[int], max_new_tokens: int, timeout_s: float) -> StreamRecord:
    """POST a streamed greedy /generate (ignore_eos: exactly max_new_tokens tokens); failures are recorded."""
    body = {"input_ids": ids, "stream": True,
            "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0, "ignore_eos": True}}
    record = StreamRecord(len(ids), time.perf_counter())
    chunks: list[tuple[float, int]] = []
    try:
        req = urllib.request.Request(url + "/generate", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            for raw in resp:
                line = raw.decode().strip()
                if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                    continue
                event = json.loads(line[5:])
                if "error" in event:
                    record.error = json.dumps(event["error"])[:300]
                    break
                chunks.append((time.perf_counter(), event["meta_info"]["completion_tokens"]))
                finish = event["meta_info"].get("finish_reason")
                if finish and finish.get("type") == "abort":
                    record.error = json.dumps(finish)[:300]
    except Exception as exc:  # reported in the record: the caller decides whether the run stops
        record.error = f"{type(exc).__name__}: {exc}"[:300]
    record.token_times = token_times(chunks)
    if record.error is None and len(record.token_times) != max_new_tokens:
        record.error = f"{len(record.token_times)} tokens streamed, {max_new_tokens} asked"
    return record


def metric_totals(text: str, names: tuple[str, ...]) -> dict[str, float]:
    """`<name>_sum` and `<name>_count` of each name, summed over every label set of a Prometheus exposition."""
    totals = {f"{n}_{suffix}": 0.0 for n in names for suffix in ("sum", "count")}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        series, _, value = line.rpartition(" ")
        name = series.split("{", 1)[0]
        if name in totals:
            totals[name] += float(value)
    return totals
