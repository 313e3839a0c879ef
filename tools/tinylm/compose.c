// SPDX-License-Identifier: MIT
/*
 * compose.c - prompt-module plans and their prefill through kvcached (see
 * compose.h). A module's KV depends only on its own tokens and position
 * ids because its tokens attend only inside the module; so the pages of
 * a module published by one prompt are exact for every other prompt that
 * names it, whatever comes before it in the slots.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compose.h"

static int perr(char *err, size_t len, int rc, const char *fmt, ...)
{
	va_list ap;

	if (err && len) {
		va_start(ap, fmt);
		vsnprintf(err, len, fmt, ap);
		va_end(ap);
	}
	return rc;
}

void tlm_plan_free(struct tlm_plan *p)
{
	if (!p)
		return;
	free(p->tok);
	free(p->pos);
	free(p->lo);
	free(p->parts);
	memset(p, 0, sizeof(*p));
}

static void put(struct tlm_plan *p, uint32_t tok, uint32_t pos, uint32_t lo)
{
	p->tok[p->n] = tok;
	p->pos[p->n] = pos;
	p->lo[p->n] = lo;
	p->n++;
}

int tlm_plan_build(struct tlm_plan *p, const struct tlm_schema *sc, const char *const *mods,
		   size_t nmods, const struct tlm_arg *args, size_t nargs, const char *user,
		   size_t user_len, char *err, size_t errlen)
{
	unsigned char *named;
	size_t cap = user_len, k, j, a;

	memset(p, 0, sizeof(*p));
	if (!sc || (!mods && nmods) || (!args && nargs) || (!user && user_len))
		return perr(err, errlen, -EINVAL, "NULL argument");
	if (!user_len)
		return perr(err, errlen, -EINVAL, "the prompt needs user text after the modules");
	named = calloc(sc->nmods, 1);
	if (!named)
		return -ENOMEM;
	for (k = 0; k < nmods; k++) {
		const struct tlm_module *m = tlm_schema_find(sc, mods[k]);
		size_t i;

		if (!m) {
			free(named);
			return perr(err, errlen, -EINVAL, "schema %s has no module %s", sc->name,
				    mods[k] ? mods[k] : "(null)");
		}
		i = m - sc->mods;
		if (named[i]) {
			free(named);
			return perr(err, errlen, -EINVAL, "module %s named twice", m->name);
		}
		for (j = 0; j < sc->nmods; j++)
			if (named[j] && m->union_id >= 0 && sc->mods[j].union_id == m->union_id) {
				free(named);
				return perr(err, errlen, -EINVAL,
					    "modules %s and %s are in the same union: name one",
					    sc->mods[j].name, m->name);
			}
		named[i] = 1;
		cap += m->len;
	}
	/* Every argument must fill a param of a named module. */
	for (a = 0; a < nargs; a++) {
		int found = 0;

		if (!args[a].name || !args[a].value) {
			free(named);
			return perr(err, errlen, -EINVAL, "argument %zu: NULL name or value", a);
		}
		for (k = 0; k < sc->nmods && !found; k++)
			for (j = 0; named[k] && j < sc->mods[k].nsegs; j++) {
				const struct tlm_seg *g = &sc->mods[k].segs[j];

				if (g->param && !strcmp(g->param, args[a].name)) {
					if (strlen(args[a].value) > g->plen) {
						free(named);
						return perr(err, errlen, -EINVAL,
							    "argument %s: %zu tokens, param holds %u",
							    args[a].name, strlen(args[a].value), g->plen);
					}
					found = 1;
					break;
				}
			}
		if (!found) {
			free(named);
			return perr(err, errlen, -EINVAL, "argument %s: no such param in the named modules",
				    args[a].name);
		}
	}
	p->tok = malloc(cap * sizeof(uint32_t));
	p->pos = malloc(cap * sizeof(uint32_t));
	p->lo = malloc(cap * sizeof(uint32_t));
	p->parts = calloc(nmods ? nmods : 1, sizeof(*p->parts));
	if (!p->tok || !p->pos || !p->lo || !p->parts) {
		free(named);
		tlm_plan_free(p);
		return -ENOMEM;
	}
	/* 1. modules, schema order; params leave position gaps. */
	for (k = 0; k < sc->nmods; k++) {
		const struct tlm_module *m = &sc->mods[k];
		struct tlm_part *part = &p->parts[p->nparts];
		uint32_t pos = m->start, lo = p->n;

		if (!named[k])
			continue;
		part->mod = m;
		part->slot = p->n;
		for (j = 0; j < m->nsegs; j++) {
			const struct tlm_seg *g = &m->segs[j];

			if (g->param) {
				pos += g->plen;
				continue;
			}
			for (size_t b = 0; b < g->len; b++)
				put(p, TLM_BYTE0 + (unsigned char)g->text[b], pos++, lo);
		}
		part->ntok = p->n - part->slot;
		p->nparts++;
	}
	p->tail = p->n;
	/* 2. arguments at their params' positions, then the user text. */
	for (k = 0; k < sc->nmods; k++) {
		const struct tlm_module *m = &sc->mods[k];
		uint32_t pos = m->start;

		for (j = 0; named[k] && j < m->nsegs; j++) {
			const struct tlm_seg *g = &m->segs[j];

			if (!g->param) {
				pos += g->len;
				continue;
			}
			for (a = 0; a < nargs; a++)
				if (!strcmp(args[a].name, g->param))
					for (size_t b = 0; args[a].value[b]; b++)
						put(p, TLM_BYTE0 + (unsigned char)args[a].value[b],
						    pos + b, 0);
			pos += g->plen;
		}
	}
	for (k = 0; k < user_len; k++)
		put(p, TLM_BYTE0 + (unsigned char)user[k], sc->end + k, 0);
	free(named);
	return 0;
}

size_t tlm_module_extra(const struct tlm_schema *sc, const struct tlm_module *m, uint8_t *buf,
			size_t len)
{
	size_t n = 0, l;
	uint8_t tail[12];

#define PUT(src, cnt) do { l = (cnt); if (n + l <= len) memcpy(buf + n, (src), l); n += l; } while (0)
	PUT("tinylm-module", 14);
	PUT(sc->name, strlen(sc->name) + 1);
	PUT(m->name, strlen(m->name) + 1);
	for (int i = 0; i < 4; i++)
		tail[i] = m->start >> (8 * i);
	for (int i = 0; i < 8; i++)
		tail[4 + i] = sc->hash >> (8 * i);
	PUT(tail, sizeof(tail));
#undef PUT
	return n;
}

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
