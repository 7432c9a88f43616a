"""The prefix cache on screen: the KV map's states and the detail view's cached-token count."""

from __future__ import annotations

from batchtop.tui.screens.request_detail import RequestScreen
from batchtop.tui.widgets.engine.kv_blocks import KVBlocksPanel
from tests.tui.test_dashboard import make_app, panel_text, step, wait_for
from tests.tui.test_text_on_screen import detail_text


async def test_the_kv_map_shows_shared_cached_and_free_blocks():
    app = make_app()  # its prompts are prefixes of each other: (1, 2), (1, 2, 3, 4), (1, ..., 6), ...
    async with app.run_test(size=(120, 36)) as pilot:
        await step(pilot)
        panel = app.query_one(KVBlocksPanel)
        # q1's block (1, 2, 3, 4) is held by q1, q2 and q3: one cell says 3
        assert "3" in panel_text(app, KVBlocksPanel) and "1 shared" in panel.border_subtitle
        await step(pilot, 3)
        snap = app.source.frame.snapshot
        cached = snap.block_refs.count(-1)
        assert cached > 0 and panel_text(app, KVBlocksPanel).count("○") == cached  # finished: cached, free
        assert f"{cached} cached" in panel.border_subtitle


async def test_the_detail_view_says_how_many_prompt_tokens_were_cached_and_keeps_it_after():
    app = make_app()
    async with app.run_test(size=(120, 36)) as pilot:
        await step(pilot)
        app.push_screen(RequestScreen(3, "q3"))  # 8 tokens: its first block is q1's, 7 may hit
        await wait_for(pilot, lambda: "prefix cache" in detail_text(app))
        assert "prefix cache: 4 of its 8 prompt tokens were cached, not computed" in detail_text(app)
        app.pop_screen()
        app.push_screen(RequestScreen(0, "q0"))
        await wait_for(pilot, lambda: "prefix cache" in detail_text(app))
        assert "0 of its 2 prompt tokens" in detail_text(app)
        app.source.act("toggle_pause")
        await wait_for(pilot, lambda: app.source.frame.state == "finished")
        await wait_for(pilot, lambda: "done: no longer in a slot" in detail_text(app))
        assert "0 of its 2 prompt tokens" in detail_text(app)  # the count stays once it has left its slot
