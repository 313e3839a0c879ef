// SPDX-License-Identifier: MIT
/*
 * policy.c - what every eviction policy shares (policy.h): the per-id
 * records, the family tree of prefix policies and the orphan list, and
 * the pick loop that parks parents until their children are gone. The
 * order itself (which id is coldest) is the policy's, in lru.c, s3fifo.c and clock.c.
 */
#include "policy.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static const struct kvd_policy_ops *const policies[KVD_EVICTION_N] = {
	[KVD_EVICTION_LRU] = &kvd_policy_lru,
	[KVD_EVICTION_S3FIFO] = &kvd_policy_s3fifo,
	[KVD_EVICTION_CLOCK] = &kvd_policy_clock,
};

int kvd_eviction_parse(const char *name)
{
	int e;

	for (e = 0; e < KVD_EVICTION_N; e++)
		if (!strcmp(name, policies[e]->name))
			return e;
	return -1;
}

const char *kvd_eviction_name(int e)
{
	return e >= 0 && e < KVD_EVICTION_N ? policies[e]->name : "?";
}

int kvd_policy_open(struct kvd_policy *p, int e, uint32_t n)
{
	uint32_t i;

	memset(p, 0, sizeof(*p));
	if (e < 0 || e >= KVD_EVICTION_N || n >= UINT32_MAX / 2 - KVD_POLICY_LISTS)
		return -EINVAL;
	p->ops = policies[e];
	p->n = n;
	p->node = calloc(n ? n : 1, sizeof(*p->node));
	p->ord = malloc(((size_t)n + KVD_POLICY_LISTS) * sizeof(*p->ord));
	p->tree = malloc((2 * (size_t)n + 1) * sizeof(*p->tree));
	if (!p->node || !p->ord || !p->tree)
		goto out_free;
	for (i = 0; i < n + KVD_POLICY_LISTS; i++)
		kvd_plist_init(p->ord, i);
	for (i = 0; i < 2 * n + 1; i++)
		kvd_plist_init(p->tree, i);
	if (p->ops->init && p->ops->init(p))
		goto out_free;
	return 0;
out_free:
	free(p->node);
	free(p->ord);
	free(p->tree);
	memset(p, 0, sizeof(*p));
	return -ENOMEM;
}

void kvd_policy_close(struct kvd_policy *p)
{
	if (!p->ops)
		return;
	if (p->ops->fini)
		p->ops->fini(p);
	free(p->node);
	free(p->ord);
	free(p->tree);
	memset(p, 0, sizeof(*p));
}

bool kvd_policy_held(const struct kvd_policy *p, uint32_t id)
{
	return id < p->n && p->node[id].held;
}

static bool has_children(const struct kvd_policy *p, uint32_t id)
{
	return !kvd_plist_empty(p->tree, p->n + id);
}

/* Take id off the order (it stays held). */
static void order_del(struct kvd_policy *p, uint32_t id)
{
	struct kvd_pnode *nd = &p->node[id];

	if (!nd->list)
		return;	/* picked or parked: `from` says where it was */
	nd->from = nd->list;
	p->ops->del(p, id);
	nd->list = 0;
}

/*
 * Take id out of its parent's children (or the orphans). A parked parent
 * left without children is a leaf again, and the coldest of its chain:
 * back at the cold end.
 */
static void tree_detach(struct kvd_policy *p, uint32_t id)
{
	uint32_t pr = p->tree[id].prev, n = p->n;

	if (pr == id)
		return;
	kvd_plist_unlink(p->tree, id);
	if (pr >= n && pr < 2 * n && kvd_plist_empty(p->tree, pr) && p->node[pr - n].parked) {
		p->node[pr - n].parked = 0;
		p->ops->add(p, pr - n, false, true);
	}
}

void kvd_policy_insert(struct kvd_policy *p, uint32_t id, uint32_t parent, uint64_t fp)
{
	struct kvd_pnode *nd;
	uint32_t gen;

	if (id >= p->n)
		return;
	if (p->node[id].held)
		kvd_policy_remove(p, id);
	nd = &p->node[id];
	gen = nd->gen + 1;
	memset(nd, 0, sizeof(*nd));
	nd->held = 1;
	nd->fp = fp;
	nd->gen = gen;
	nd->up = KVD_POLICY_NONE;
	p->held++;
	/* Edges only go from a newer block to one held before it, so the
	 * tree has no cycle whatever the parent keys claim. */
	if (p->ops->prefix && parent < p->n && parent != id && p->node[parent].held) {
		kvd_plist_after(p->tree, p->n + parent, id);
		nd->up = parent;
		nd->up_gen = p->node[parent].gen;
		if (p->node[parent].list) {
			p->ops->add_behind(p, id, parent);
			return;
		}
	}
	p->ops->add(p, id, false, false);
}

void kvd_policy_touch(struct kvd_policy *p, uint32_t id)
{
	struct kvd_pnode *nd;

	if (id >= p->n || !p->node[id].held)
		return;
	nd = &p->node[id];
	if (nd->list) {
		p->ops->touch(p, id);
	} else if (nd->parked) {
		/* Used again: back on the order, parked again if it reaches
		 * the cold end with children still there. */
		nd->parked = 0;
		p->ops->add(p, id, true, false);
	}
	/* else: picked, being evicted; keep or remove decides. */
}

uint32_t kvd_policy_pick(struct kvd_policy *p)
{
	uint32_t steps = 0, id, orph = 2 * p->n;

	/* Stranded children first: no lookup can reach them. */
	while (p->ops->prefix && !kvd_plist_empty(p->tree, orph)) {
		id = kvd_plist_head(p->tree, orph);
		kvd_plist_unlink(p->tree, id);
		p->node[id].up = KVD_POLICY_NONE;	/* stranded for good */
		if (p->node[id].list || p->node[id].parked) {
			order_del(p, id);
			p->node[id].parked = 0;
			return id;
		}
		/* Picked already (a candidate of this batch): it is a root now. */
	}
	for (;;) {
		id = p->ops->next(p, &steps);
		if (id == KVD_POLICY_NONE)
			return KVD_POLICY_NONE;
		order_del(p, id);
		if (!p->ops->prefix)
			return id;
		if (!has_children(p, id)) {
			/* A candidate is no child any more: its parent, next in
			 * line, may be picked in the same batch. keep() puts it
			 * back under its parent. */
			tree_detach(p, id);
			return id;
		}
		/* A parent whose children are still cached: it comes back at
		 * the cold end when the last of them leaves, or when used. */
		p->node[id].parked = 1;
		if (++steps > KVD_POLICY_STEPS)
			return KVD_POLICY_NONE;
	}
}

void kvd_policy_keep(struct kvd_policy *p, uint32_t id)
{
	struct kvd_pnode *nd;

	if (id >= p->n || !p->node[id].held || p->node[id].list || p->node[id].parked)
		return;
	nd = &p->node[id];
	/* Back under its parent if that is the same block still; a parent
	 * that went meanwhile leaves it a root (stranded, but pinned). */
	if (nd->up < p->n && p->node[nd->up].held && p->node[nd->up].gen == nd->up_gen) {
		if (p->tree[id].prev == id)
			kvd_plist_after(p->tree, p->n + nd->up, id);
	} else {
		nd->up = KVD_POLICY_NONE;
	}
	p->ops->add(p, id, true, false);
}

void kvd_policy_remove(struct kvd_policy *p, uint32_t id)
{
	struct kvd_pnode *nd;
	uint32_t n = p->n;

	if (id >= n || !p->node[id].held)
		return;
	nd = &p->node[id];
	order_del(p, id);
	if (p->ops->gone)
		p->ops->gone(p, id, nd->from);
	tree_detach(p, id);
	/* Its children are stranded: splice them onto the orphans, O(1). */
	if (has_children(p, id)) {
		struct kvd_plink *t = p->tree;
		uint32_t first = t[n + id].next, last = t[n + id].prev, o = 2 * n;
		uint32_t otail = t[o].prev;

		t[otail].next = first;
		t[first].prev = otail;
		t[last].next = o;
		t[o].prev = last;
		kvd_plist_init(t, n + id);
	}
	nd->held = 0;
	nd->parked = 0;
	p->held--;
}

int kvd_policy_switch(struct kvd_policy *p, int e, uint32_t (*parent)(void *arg, uint32_t id),
		      void *arg)
{
	struct kvd_policy np;
	uint32_t *stack, i, k, id, up;
	uint8_t *seen;

	if (kvd_policy_open(&np, e, p->n))
		return -ENOMEM;
	stack = malloc((p->n ? p->n : 1) * sizeof(*stack));
	seen = calloc(p->n ? p->n : 1, 1);
	if (!stack || !seen) {
		free(stack);
		free(seen);
		kvd_policy_close(&np);
		return -ENOMEM;
	}
	/* Every held id, each after its held parent (the caller's say, so a
	 * policy that kept no tree gives one to a policy that needs it):
	 * climb to the first ancestor already in, then insert down. Each id
	 * is climbed over once. */
	for (i = 0; i < p->n; i++) {
		for (k = 0, id = i; id < p->n && p->node[id].held && !seen[id]; id = up) {
			seen[id] = 1;
			stack[k++] = id;
			up = parent(arg, id);
		}
		while (k--) {
			id = stack[k];
			up = parent(arg, id);
			kvd_policy_insert(&np, id, up < np.n && np.node[up].held ? up : KVD_POLICY_NONE,
					  p->node[id].fp);
		}
	}
	free(stack);
	free(seen);
	kvd_policy_close(p);
	*p = np;
	return 0;
}
