/* SPDX-License-Identifier: MIT */
/*
 * compose.h - prompts built from schema modules (Prompt Cache). A prompt
 * names some modules of a schema (any combination, at most one per union,
 * in any order), arguments for their params, and user text. The plan lays
 * the tokens out in KV slots:
 *
 *   1. each named module in schema order: its text tokens at the module's
 *      own position ids (params leave gaps), each attending only to the
 *      module's earlier tokens: what makes a module's KV the same in every
 *      prompt, so it is cached once and reused anywhere;
 *   2. the arguments, at their params' positions, then the user text at
 *      positions from the schema's end, each attending to every slot
 *      before it (all modules included).
 *
 * A module's pages are keyed by the module, not by the prompt's prefix:
 * kvc_req_new gets the module's text tokens and an `extra` blob naming
 * schema, module, start position and the schema text's hash, so the chain
 * root is the module identity (docs/TINYLM.md).
 */
#ifndef TINYLM_COMPOSE_H
#define TINYLM_COMPOSE_H

#include "schema.h"
#include "tinylm.h"

struct tlm_arg {
	const char *name;	/* a param of one of the named modules */
	const char *value;	/* text, at most the param's len in tokens */
};

struct tlm_part {
	const struct tlm_module *mod;
	size_t slot;		/* first slot */
	size_t ntok;		/* text tokens */
};

struct tlm_plan {
	size_t n;		/* slots */
	uint32_t *tok, *pos, *lo;	/* per slot: token, position id, first slot seen */
	struct tlm_part *parts;	/* the modules, in slot order */
	size_t nparts;
	size_t tail;		/* first slot of arguments + user text */
};

/*
 * Build the plan. Errors (-EINVAL, err says which): unknown module, a
 * module named twice, two modules of one union, an argument for no param
 * of the named modules or longer than its param, empty user text.
 * -ENOMEM.
 */
int tlm_plan_build(struct tlm_plan *p, const struct tlm_schema *sc, const char *const *mods,
		   size_t nmods, const struct tlm_arg *args, size_t nargs, const char *user,
		   size_t user_len, char *err, size_t errlen);
void tlm_plan_free(struct tlm_plan *p);

/* The kvc_req_new extra blob of a module; returns its length. */
size_t tlm_module_extra(const struct tlm_schema *sc, const struct tlm_module *m, uint8_t *buf,
			size_t len);

/*
 * Run the plan into an empty state, with kvcached through c (NULL: none):
 * per module, look its blocks up, gather the hits, run the rest of the
 * module and publish its missed full blocks; then run the tail with
 * logits. Bitwise equal to tlm_forward(s, p->tok, p->pos, p->lo, p->n, 1).
 * run->hit_tokens / computed / published sum over the modules. Returns 0
 * or what tlm_forward returns.
 */
int tlm_compose(struct tlm_state *s, kvc_t *c, const struct tlm_schema *sc,
		const struct tlm_plan *p, struct tlm_run *run);

#endif
