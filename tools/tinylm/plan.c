// SPDX-License-Identifier: MIT
/*
 * plan.c - prompt-module plans (see compose.h): which tokens go in which
 * KV slot, at which position id, seeing which slots; and the key blob of a
 * module. Pure computation over a parsed schema: no model, no cache (the
 * schema fuzz target links it).
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
		for (j = 0; j < a; j++)
			if (!strcmp(args[j].name, args[a].name)) {
				free(named);
				return perr(err, errlen, -EINVAL, "argument %s given twice",
					    args[a].name);
			}
		/* It fills every param of that name in the named modules (names
		 * are unique within a module only): it must fit each of them. */
		for (k = 0; k < sc->nmods; k++)
			for (j = 0; named[k] && j < sc->mods[k].nsegs; j++) {
				const struct tlm_seg *g = &sc->mods[k].segs[j];

				if (g->param && !strcmp(g->param, args[a].name)) {
					if (strlen(args[a].value) > g->plen) {
						free(named);
						return perr(err, errlen, -EINVAL,
							    "argument %s: %zu tokens, param %s of module %s holds %u",
							    args[a].name, strlen(args[a].value), g->param,
							    sc->mods[k].name, g->plen);
					}
					found = 1;
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
