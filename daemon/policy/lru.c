// SPDX-License-Identifier: MIT
/*
 * lru.c - prefix-aware LRU (policy.h): one recency list, the most
 * recent at the head. policy.c parks a parent that reaches the tail while
 * it still has children, and puts it back at the tail when they are gone,
 * so the blocks leave leaves first, in LRU order.
 */
#include "policy.h"

#define LRU 1

static uint32_t sentinel(const struct kvd_policy *p)
{
	return p->n + LRU;
}

static void lru_add(struct kvd_policy *p, uint32_t id, bool used, bool cold)
{
	(void)used;
	if (cold)
		kvd_plist_after(p->ord, kvd_plist_tail(p->ord, sentinel(p)), id);
	else
		kvd_plist_after(p->ord, sentinel(p), id);
	p->node[id].list = LRU;
}

static void lru_add_behind(struct kvd_policy *p, uint32_t id, uint32_t behind)
{
	kvd_plist_after(p->ord, behind, id);
	p->node[id].list = LRU;
}

static void lru_touch(struct kvd_policy *p, uint32_t id)
{
	kvd_plist_unlink(p->ord, id);
	kvd_plist_after(p->ord, sentinel(p), id);
}

static void lru_del(struct kvd_policy *p, uint32_t id)
{
	kvd_plist_unlink(p->ord, id);
}

static uint32_t lru_next(struct kvd_policy *p, uint32_t *steps)
{
	uint32_t t = kvd_plist_tail(p->ord, sentinel(p));

	(void)steps;
	return t == sentinel(p) ? KVD_POLICY_NONE : t;
}

const struct kvd_policy_ops kvd_policy_lru = {
	.name = "lru",
	.prefix = true,
	.add = lru_add,
	.add_behind = lru_add_behind,
	.touch = lru_touch,
	.del = lru_del,
	.next = lru_next,
};
