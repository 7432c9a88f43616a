"""ShareGPT-style conversation datasets (the JSON vLLM's serving benchmarks read) as a workload.

The file is a JSON list of {"conversations": [{"from": "human", "value": ...}, {"from": "gpt",
"value": ...}, ...]}. Each conversation gives one request: its first human turn is the prompt, and
the token count of the answer that follows it is max_tokens. A conversation without such a pair is
skipped, as vLLM's benchmark skips it; anything not shaped like the format is refused, by entry.
With a model that has a chat template, the human turn goes through it as a user message (the
assistant turn opened), as a chat server would render it; without one it is raw text.
"""

from __future__ import annotations

from batchtop.core_engine.errors import WorkloadError
from batchtop.core_engine.model.tokenizer import Tokenizer
from batchtop.core_engine.text_files import NotText, parse_json
from batchtop.core_engine.workload.prompt_tokens import chat_tokens, check_text, text_tokens

HUMAN = ("human", "user")
ANSWER = ("gpt", "assistant", "chatgpt")


def first_exchange(turns: list, error) -> tuple[str, str] | None:
    """The first human turn and the answer right after it, if the conversation has them."""
    for i, turn in enumerate(turns):
        if not isinstance(turn, dict) or not isinstance(turn.get("from"), str) \
                or not isinstance(turn.get("value"), str):
            raise error(f"turn {i} must be an object with string \"from\" and \"value\"")
    for prompt, answer in zip(turns, turns[1:]):
        if prompt["from"] in HUMAN and answer["from"] in ANSWER:
            return prompt["value"], answer["value"]
    return None


def read_sharegpt(path: str, text: str, tokenizer: Tokenizer | None,
                  limit: int | None = None) -> list[tuple[str, tuple[int, ...], int]]:
    """(request id, prompt token ids, max_tokens) for the first `limit` usable conversations of the
    dataset `text` (the file at `path`, already read as UTF-8)."""
    if tokenizer is None:
        raise WorkloadError(path, "a ShareGPT dataset is text and needs a tokenizer: run with --model DIR "
                                  "(a model directory with a tokenizer.json)")
    try:
        data = parse_json(text)
    except NotText as exc:
        hint = " (a JSON Lines workload, one request per line, is named .jsonl)" if "Extra data" in exc.message else ""
        raise WorkloadError(path, exc.message + hint, exc.line) from None
    if not isinstance(data, list):
        raise WorkloadError(path, 'a ShareGPT dataset is a JSON list of {"conversations": [...]} objects')
    out: list[tuple[str, tuple[int, ...], int]] = []
    for i, entry in enumerate(data):
        if limit is not None and len(out) >= limit:
            break

        def error(message: str, i: int = i) -> WorkloadError:
            return WorkloadError(path, f"entry [{i}]: {message}")

        turns = entry.get("conversations") if isinstance(entry, dict) else None
        if not isinstance(turns, list):
            raise error('expected an object with a "conversations" list')
        exchange = first_exchange(turns, error)
        if exchange is None:
            continue
        if tokenizer.chat_template is not None:
            check_text(exchange[0], "the human turn", error)
            prompt_ids = chat_tokens(tokenizer, [{"role": "user", "content": exchange[0]}], "the human turn", error)
        else:
            prompt_ids = text_tokens(tokenizer, exchange[0], "the human turn", error)
        max_tokens = len(text_tokens(tokenizer, exchange[1], "the answer", error, add_special_tokens=False))
        if exchange[0] and max_tokens:
            out.append((f"sg{i}", tuple(prompt_ids), max_tokens))
    if not out:
        raise WorkloadError(path, "no conversation has a human turn followed by an answer")
    return out
