// SPDX-License-Identifier: MIT
/*
 * compose.c - the prefill of prompt-module plans through kvcached (see
 * compose.h). A module's KV depends only on its own tokens and position
 * ids because its tokens attend only inside the module; so the pages of
 * a module published by one prompt are exact for every other prompt that
 * names it, whatever comes before it in the slots.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compose.h"

/* One module's slots: cached blocks gathered, the rest run, misses published. */
static int module_run(struct tlm_state *s, kvc_t *c, const struct tlm_schema *sc,
		      const struct tlm_plan *p, const struct tlm_part *part, struct tlm_run *run)
{
	const uint32_t *tok = p->tok + part->slot;
	struct kvc_req *r = NULL;
	size_t bt = 0, i, from;
	int hits = 0, got = 0, rc;

	if (c) {
		uint8_t extra[256];
		char label[KVC_MAX_LABEL + 1];
		size_t el = tlm_module_extra(sc, part->mod, extra, sizeof(extra));

		bt = kvc_block_tokens(c);
		snprintf(label, sizeof(label), "mod:%s", part->mod->name);
		rc = el <= sizeof(extra) ? kvc_req_new(c, tok, part->ntok, extra, el, &r) : -E2BIG;
		if (!rc)
			rc = kvc_req_label(r, label);
		if (!rc) {
			hits = kvc_lookup(r);
			rc = hits < 0 ? hits : 0;
		}
		if (!rc) {
			for (i = 0; i < (size_t)hits; i++)
				tlm_kv_gather(s, part->slot + i * bt, kvc_block(r, i), bt);
			s->n = part->slot + hits * bt;
			run->hit_tokens += hits * bt;
			if ((size_t)hits < kvc_req_blocks(r)) {
				got = kvc_alloc(r);
				rc = got < 0 ? got : 0;
				got = got < 0 ? 0 : got;
			}
		}
		if (rc) {
			run->cache_err = rc;
			hits = hits < 0 ? 0 : hits;
		}
	}
	from = s->n - part->slot;
	rc = tlm_forward(s, tok + from, p->pos + part->slot + from, p->lo + part->slot + from,
			 part->ntok - from, 0);
	if (rc) {
		kvc_req_free(r);
		return rc;
	}
	run->computed += part->ntok - from;
	if (got > 0) {
		for (i = hits; i < (size_t)hits + got; i++)
			tlm_kv_scatter(s, part->slot + i * bt, kvc_block(r, i), bt);
		rc = kvc_publish(r);
		if (rc < 0)
			run->cache_err = rc;
		else
			run->published += got;
	}
	kvc_req_free(r);
	return 0;
}

int tlm_compose(struct tlm_state *s, kvc_t *c, const struct tlm_schema *sc,
		const struct tlm_plan *p, struct tlm_run *run)
{
	struct tlm_run dummy;
	int rc;

	if (!run)
		run = &dummy;
	memset(run, 0, sizeof(*run));
	if (!s || !sc || !p || s->n || p->tail >= p->n)
		return -EINVAL;
	if (p->n > s->cap)
		return -ENOSPC;
	run->tokens = p->n;
	for (size_t k = 0; k < p->nparts; k++) {
		if (!p->parts[k].ntok)	/* params only: nothing to cache */
			continue;
		rc = module_run(s, c, sc, p, &p->parts[k], run);
		if (rc) {
			s->n = 0;
			return rc;
		}
	}
	rc = tlm_forward(s, p->tok + p->tail, p->pos + p->tail, p->lo + p->tail, p->n - p->tail, 1);
	if (rc) {
		s->n = 0;
		return rc;
	}
	run->computed += p->n - p->tail;
	return 0;
}
