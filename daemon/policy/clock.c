// SPDX-License-Identifier: MIT
/*
 * clock.c - CLOCK (policy.h): blocks in insertion order with a
 * reference bit; the cold end's block goes unless its bit is set, which
 * buys it one more round. Not prefix-aware: a baseline, the daemon's
 * policy before policy.h.
 */
#include "policy.h"

#define RING 1

static uint32_t sentinel(const struct kvd_policy *p)
{
	return p->n + RING;
}

static void clock_add(struct kvd_policy *p, uint32_t id, bool used, bool cold)
{
	if (cold)
		kvd_plist_after(p->ord, kvd_plist_tail(p->ord, sentinel(p)), id);
	else
		kvd_plist_after(p->ord, sentinel(p), id);
	p->node[id].list = RING;
	p->node[id].freq = used;
}

static void clock_add_behind(struct kvd_policy *p, uint32_t id, uint32_t behind)
{
	kvd_plist_after(p->ord, behind, id);
	p->node[id].list = RING;
	p->node[id].freq = 0;
}

static void clock_touch(struct kvd_policy *p, uint32_t id)
{
	p->node[id].freq = 1;
}

static void clock_del(struct kvd_policy *p, uint32_t id)
{
	kvd_plist_unlink(p->ord, id);
}

static uint32_t clock_next(struct kvd_policy *p, uint32_t *steps)
{
	uint32_t s = sentinel(p), t;

	while ((t = kvd_plist_tail(p->ord, s)) != s) {
		if (!p->node[t].freq || ++*steps > KVD_POLICY_STEPS)
			return t;
		p->node[t].freq = 0;
		kvd_plist_unlink(p->ord, t);
		kvd_plist_after(p->ord, s, t);
	}
	return KVD_POLICY_NONE;
}

const struct kvd_policy_ops kvd_policy_clock = {
	.name = "clock",
	.prefix = false,
	.add = clock_add,
	.add_behind = clock_add_behind,
	.touch = clock_touch,
	.del = clock_del,
	.next = clock_next,
};
