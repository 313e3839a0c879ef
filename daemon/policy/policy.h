/* SPDX-License-Identifier: MIT */
/*
 * policy.h - which cached block goes next: the eviction policy.
 *
 * The policy only picks victims. The mechanism is one and lives with its
 * callers: evict.c marks a candidate EVICTING, scans the ledgers for pins,
 * hands it to the tiers or frees it, and reports it to the KV events;
 * spill.c recycles a slot. Both keep one struct kvd_policy over their own
 * id space (pool pages; spill slots) and tell it four things:
 *
 *   kvd_policy_insert   id now holds a block (published, restored,
 *                       spilled), with the id of its parent block in the
 *                       same space when that is held too;
 *   kvd_policy_touch    the block was used (a lookup pinned it, in the
 *                       order the client's ring recorded);
 *   kvd_policy_pick     the next candidate, taken out of the order: the
 *                       caller either removes it (gone) or keeps it (could
 *                       not go: pinned, busy), which puts it back as used;
 *   kvd_policy_remove   id holds no block any more.
 *
 * Policies (config key `eviction`):
 *
 *   lru     prefix-aware LRU: leaves in least-recently-used order; a block
 *           with children in the pool waits until its children are gone;
 *           stranded children (their parent left) go first. Clients touch
 *           a hit run deepest block first and a new block enters just
 *           colder than its parent, so a request's tail is older than its
 *           head: the tail goes first, as vLLM's free queue does.
 *   s3fifo  S3-FIFO (small FIFO 10%, main FIFO 90%, ghost of recent
 *           evictions from small; two-bit frequency): blocks seen once
 *           leave from the small queue, so a scan of one-off documents
 *           does not flush the hot set. Prefix-aware like lru.
 *   clock   CLOCK (second chance) over the blocks in insertion order, not
 *           prefix-aware: the daemon's policy before, kept as a baseline.
 *
 * Cost: every call is O(1) but pick, which is amortized O(1): each step
 * past a candidate it cannot return (a parent that still has children, a
 * block with frequency left) consumes something an earlier O(1) call
 * created (a child insert, a touch), and one pick takes at most
 * KVD_POLICY_STEPS such steps. Memory: 56 bytes per id, and s3fifo's ghost
 * 48 more. No call ever walks the id space.
 *
 * Ids given to touch come from client-written memory: any value is
 * accepted and one out of range or not held is ignored.
 */
#ifndef KVD_POLICY_H
#define KVD_POLICY_H

#include <stdbool.h>
#include <stdint.h>

#define KVD_POLICY_NONE UINT32_MAX
#define KVD_POLICY_STEPS 4096	/* steps one pick may take at most */

enum kvd_eviction {
	KVD_EVICTION_LRU = 0,
	KVD_EVICTION_S3FIFO,
	KVD_EVICTION_CLOCK,
	KVD_EVICTION_N,
};

/* Links of one doubly linked circular list node; sentinels are ids >= n. */
struct kvd_plink {
	uint32_t prev, next;
};

/* Per id. */
struct kvd_pnode {
	uint64_t fp;		/* block fingerprint (s3fifo's ghost) */
	uint32_t gen;		/* bumped by every insert of the id */
	uint32_t up, up_gen;	/* prefix: parent id and its gen, or NONE */
	uint8_t held;		/* holds a block */
	uint8_t list;		/* order list it is on (policy's), 0: none */
	uint8_t from;		/* the list it was picked from */
	uint8_t freq;		/* policy's use count */
	uint8_t parked;		/* prefix: off the order until a leaf again */
};

struct kvd_policy;

struct kvd_policy_ops {
	const char *name;
	bool prefix;		/* children before parents, orphans first */
	/* Allocate/initialize policy state in p->priv; 0 or -ENOMEM. */
	int (*init)(struct kvd_policy *p);
	void (*fini)(struct kvd_policy *p);
	/* id enters the order: new (used false), or kept after a failed
	 * eviction or a touch while parked (used true), or a parent whose
	 * last child left while it was parked (cold true: it is the coldest
	 * of its chain). */
	void (*add)(struct kvd_policy *p, uint32_t id, bool used, bool cold);
	/* A new id enters just colder than `behind` (on the order): its
	 * parent. */
	void (*add_behind)(struct kvd_policy *p, uint32_t id, uint32_t behind);
	/* id (on the order) was used. */
	void (*touch)(struct kvd_policy *p, uint32_t id);
	/* id leaves the order (taken, parked or gone). */
	void (*del)(struct kvd_policy *p, uint32_t id);
	/* The id the policy would evict now (still on the order), or NONE.
	 * May reorder (second chances) within its step budget. */
	uint32_t (*next)(struct kvd_policy *p, uint32_t *steps);
	/* id, picked from list `from`, was removed: it is gone. */
	void (*gone)(struct kvd_policy *p, uint32_t id, uint8_t from);
};

struct kvd_policy {
	const struct kvd_policy_ops *ops;
	uint32_t n;		/* ids 0..n-1 */
	uint32_t held;		/* ids holding a block */
	struct kvd_pnode *node;	/* n */
	/* Order lists: n ids + KVD_POLICY_LISTS sentinels. */
	struct kvd_plink *ord;
	/* Family tree (prefix policies): node id is id's place among its
	 * siblings, n + id the sentinel of id's children, 2n the orphans'
	 * list (children whose parent left). */
	struct kvd_plink *tree;
	void *priv;
};

#define KVD_POLICY_LISTS 4

extern const struct kvd_policy_ops kvd_policy_lru, kvd_policy_s3fifo, kvd_policy_clock;

/* The policy named `name` ("lru", "s3fifo", "clock"), or -1. The
 * daemon's default is s3fifo (config.c; ARCHITECTURE.md §7 says why). */
int kvd_eviction_parse(const char *name);
const char *kvd_eviction_name(int e);

/* Set up p for ids 0..n-1 with policy e. 0, -EINVAL or -ENOMEM. */
int kvd_policy_open(struct kvd_policy *p, int e, uint32_t n);
void kvd_policy_close(struct kvd_policy *p);
/* id holds a block now; parent: the id of its parent block, or NONE. fp:
 * a fingerprint of the block (its key), for policies with a history.
 * With a prefix policy a block whose parent is held enters just colder
 * than its parent: a request's new blocks arrive parent first (and the
 * parent was just used) but must leave child first. */
void kvd_policy_insert(struct kvd_policy *p, uint32_t id, uint32_t parent, uint64_t fp);
/* id's block was used (untrusted id: ignored unless held). */
void kvd_policy_touch(struct kvd_policy *p, uint32_t id);
/* The next victim, taken out of the order; NONE when none is left. */
uint32_t kvd_policy_pick(struct kvd_policy *p);
/* A picked id could not go: back on the order as just used. */
void kvd_policy_keep(struct kvd_policy *p, uint32_t id);
/* id holds no block any more (evicted, dropped, freed). Its children in
 * the tree become orphans, which a prefix policy picks first. */
void kvd_policy_remove(struct kvd_policy *p, uint32_t id);
/* Is id holding a block? */
bool kvd_policy_held(const struct kvd_policy *p, uint32_t id);

/*
 * Replace p by a policy of kind e (a reload changed `eviction`) holding
 * the same ids, each under the id parent(arg, id) names when that is held
 * (KVD_POLICY_NONE: none). What the old policy knew of recency and
 * frequency is lost: the ids enter in id order, as if new. One pass over
 * the ids. 0, or -ENOMEM (p unchanged).
 */
int kvd_policy_switch(struct kvd_policy *p, int e, uint32_t (*parent)(void *arg, uint32_t id),
		      void *arg);

/* List helpers for the policy files (sentinel s is an id >= n). */
static inline void kvd_plist_init(struct kvd_plink *l, uint32_t s)
{
	l[s].prev = l[s].next = s;
}

static inline bool kvd_plist_empty(const struct kvd_plink *l, uint32_t s)
{
	return l[s].next == s;
}

/* Insert id after node at (at == sentinel: at the head). */
static inline void kvd_plist_after(struct kvd_plink *l, uint32_t at, uint32_t id)
{
	uint32_t nx = l[at].next;

	l[id].prev = at;
	l[id].next = nx;
	l[nx].prev = id;
	l[at].next = id;
}

static inline void kvd_plist_unlink(struct kvd_plink *l, uint32_t id)
{
	l[l[id].prev].next = l[id].next;
	l[l[id].next].prev = l[id].prev;
	l[id].prev = l[id].next = id;
}

/* Head (most recent) and tail (oldest) of list s; s itself when empty. */
static inline uint32_t kvd_plist_head(const struct kvd_plink *l, uint32_t s)
{
	return l[s].next;
}

static inline uint32_t kvd_plist_tail(const struct kvd_plink *l, uint32_t s)
{
	return l[s].prev;
}

#endif
