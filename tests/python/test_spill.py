# SPDX-License-Identifier: MIT
"""The spill tier through Python: a lookup sees the blocks waiting on disk
(spilled), restore_pays() weighs them against the engine's prefill speed,
restore() brings them back with their bytes."""
from __future__ import annotations

import shutil
import tempfile


import kvclient
from conftest import tiny_model, tokens, wait_for

NB = 8	# blocks per prompt


def test_spilled_blocks_restore(daemon_factory):
    spill = tempfile.mkdtemp(prefix="kvt-py-spill.")
    try:
        d = daemon_factory("--spill-dir", spill, "--spill-size", "4M")
        with kvclient.Client(tiny_model(), socket=d.sock) as c:
            pool = c.stats()["pool"]["pages"]
            prompts = [tokens(NB * 16, 500 + p) for p in range(2 * pool // NB)]
            for p, t in enumerate(prompts):	# twice what the pool holds
                with c.request(t) as r:
                    r.lookup()
                    assert r.alloc() == NB
                    for i in range(NB):
                        r.page_array(i)[...] = p * NB + i
                    assert r.publish() == NB

            def settled():
                a = c.stats()["counters"]
                return a["spills"] > 0 and a["pages_spilled"] == a["spills"] and a
            wait_for(settled, "spill writes done")
            with c.request(prompts[0]) as r:
                hits = r.lookup()
                spilled = r.spilled
                assert spilled > 0 and hits + spilled == NB
                assert r.restore_pays(prefill_tokens_per_s=1.0)
                assert not r.restore_pays(prefill_tokens_per_s=1e15)
                assert r.restore() == NB == r.hits
                for i in range(NB):
                    assert (r.page_array(i) == i).all()
                assert r.spilled == 0
            assert c.stats()["counters"]["restores"] >= spilled
            # Or prefill instead: a spilled run left alone is a miss.
            with c.request(prompts[1]) as r:
                hits = r.lookup()
                assert r.spilled == NB - hits > 0
                assert r.alloc() == NB - hits and r.spilled == 0
                assert r.publish() == NB
    finally:
        shutil.rmtree(spill, ignore_errors=True)
