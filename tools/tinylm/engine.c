// SPDX-License-Identifier: MIT
/*
 * engine.c - tinylm's prefill through kvcached, the way a serving engine
 * uses libkvclient: key the prompt, look the prefix up (a read of shared
 * memory), gather the hit pages into the engine's KV, run only the missed
 * tokens, write the missed full blocks into pages granted by one ALLOC
 * and publish them with one PUBLISH.
 *
 * Why gather (copy) instead of attending straight out of the pinned pages:
 * the copy costs about 1 ms per 8 MiB here against seconds of prefill for
 * the same tokens; the attention loop then reads one layout on the cold and
 * warm paths alike, which keeps them bitwise equal by construction; and
 * decoding appends to the same contiguous KV. A GPU engine does the same
 * with the gather kernel of kernels/.
 *
 * Single flight: blocks another process is writing right now are waited
 * for (kvc_wait, up to TLM_WAIT_MS) rather than computed a second time,
 * unless the caller says TLM_NO_WAIT. The pages this prefill is granted
 * are announced before it computes, so others wait for it in turn.
 *
 * The cache can only make a prefill faster, never change or fail it: any
 * kvc_ error is noted in the run record and the tokens are computed.
 */
#include <errno.h>
#include <stdbool.h>
#include <string.h>

#include "tinylm.h"

/* Prompt tokens per second this engine prefills at, at best (a CPU
 * engine: fewer in practice), for kvc_restore_pays. */
#define TLM_PREFILL_TPS 4000.0

/*
 * After the lookup: wait for the blocks other processes are writing now
 * (single flight; not with TLM_NO_WAIT), then ask for pages for the rest.
 * A kvc_alloc that finds a block taken since (-EINPROGRESS) sends us back
 * to wait for that one, within the same deadline. Returns the pages
 * granted (0 on error, noted in run); *hits is updated.
 */
static int claim(struct kvc_req *r, unsigned flags, size_t blocks, size_t bt, int *hits,
		 struct tlm_run *run)
{
	bool wait = !(flags & (TLM_NO_WAIT | TLM_NO_LOOKUP)) && !run->cache_err;
	double deadline = tlm_now() + TLM_WAIT_MS / 1e3;
	int got = 0, h, from = *hits;

	for (;;) {
		got = 0;
		if (wait) {
			double left = deadline - tlm_now();

			h = kvc_wait(r, left > 0 ? (int)(left * 1e3) : 0);
			if (h < 0) {
				run->cache_err = h;
				break;
			}
			*hits = h;
		}
		if ((flags & TLM_NO_PUBLISH) || (size_t)*hits >= blocks || run->cache_err)
			break;
		run->missed = blocks - (size_t)*hits;
		got = kvc_alloc(r);
		if (got != -EINPROGRESS)
			break;
	}
	if (run->missed && (size_t)(got > 0 ? got : 0) < run->missed)
		run->short_err = kvc_req_short_reason(r);
	run->wait_tokens = (size_t)(*hits - from) * bt;
	if (got < 0) {
		run->cache_err = got;
		got = 0;
	}
	return got;
}

/* Note n restored blocks, the first `spilled` of them from disk. */
static void restored_from(struct tlm_run *run, size_t n, size_t spilled, size_t bt)
{
	size_t disk = n < spilled ? n : spilled;

	run->spill_tokens = disk * bt;
	run->remote_tokens = (n - disk) * bt;
}

int tlm_prefill(struct tlm_state *s, kvc_t *c, const uint32_t *tok, size_t n,
		const void *extra, size_t extra_len, const char *label, unsigned flags,
		struct tlm_run *run)
{
	struct tlm_run dummy;
	struct kvc_req *r = NULL;
	size_t bt = 0, blocks = 0, use = 0, from, i, unused, trim;
	int hits = 0, got = 0, rc;

	if (!run)
		run = &dummy;
	memset(run, 0, sizeof(*run));
	run->tokens = n;
	if (!s || !tok || !n || s->n)
		return -EINVAL;
	if (n > s->cap)
		return -ENOSPC;
	if (c) {
		bt = kvc_block_tokens(c);
		rc = kvc_req_new(c, tok, n, extra, extra_len, &r);
		if (!rc && label)
			rc = kvc_req_label(r, label);
		if (rc) {
			run->cache_err = rc;
			kvc_req_free(r);
			r = NULL;
		}
	}
	if (r) {
		blocks = kvc_req_blocks(r);
		if (!(flags & TLM_NO_LOOKUP)) {
			hits = kvc_lookup(r);
			if (hits < 0) {
				run->cache_err = hits;
				hits = 0;
			}
			/* Blocks on this host's disk or on other hosts: bring
			 * them in when that beats computing them. */
			if (!run->cache_err && (kvc_req_spilled(r) || kvc_req_remote(r)) &&
			    kvc_restore_pays(r, TLM_PREFILL_TPS) == 1) {
				size_t spilled = kvc_req_spilled(r);

				rc = kvc_restore(r);
				if (rc < 0) {
					run->cache_err = rc;
				} else {
					/* The spilled run comes first, then the
					 * remote one (kvclient.h). */
					restored_from(run, (size_t)(rc - hits), spilled, bt);
					hits = rc;
				}
			}
		}
		got = claim(r, flags, blocks, bt, &hits, run);
		/* The last token always runs: its logits are the output. */
		use = (size_t)hits < (n - 1) / bt ? (size_t)hits : (n - 1) / bt;
		for (i = 0; i < use; i++)
			tlm_kv_gather(s, i * bt, kvc_block(r, i), bt);
		s->n = use * bt;
		run->hit_tokens = use * bt;
		/* Hits not used are the last ones: remote first, then disk. */
		unused = ((size_t)hits - use) * bt;
		trim = unused < run->remote_tokens ? unused : run->remote_tokens;
		run->remote_tokens -= trim;
		unused -= trim;
		run->spill_tokens -= unused < run->spill_tokens ? unused : run->spill_tokens;
	}
	from = s->n;
	rc = tlm_forward(s, tok + from, NULL, NULL, n - from, 1);
	if (rc) {
		s->n = 0;
		kvc_req_free(r);
		return rc;
	}
	run->computed = n - from;
	if (got > 0) {
		for (i = hits; i < (size_t)hits + got; i++)
			tlm_kv_scatter(s, i * bt, kvc_block(r, i), bt);
		rc = kvc_publish(r);
		if (rc < 0)
			run->cache_err = rc;
		else
			run->published = got;
	}
	kvc_req_free(r);
	return 0;
}
