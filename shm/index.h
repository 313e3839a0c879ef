/* SPDX-License-Identifier: MIT */
/*
 * index.h - the hash index: 128-bit key -> page, in shared memory.
 *
 * Open addressing over cache-line buckets of KVSHM_BUCKET_ENTRIES entries;
 * an entry lives in its home bucket or one of the next KVSHM_PROBE_MAX - 1.
 * Entries never move once inserted, so a reader that raced a writer at
 * worst misses (safe), never returns a torn entry (seqcount). Writers are
 * the daemon's main thread only; readers are anyone with a read-only map.
 */
#ifndef KVSHM_INDEX_H
#define KVSHM_INDEX_H

#include <stdatomic.h>

#include "segment.h"

/* Home bucket of a key. */
static inline uint32_t kvshm_index_home(const struct kvshm_header *h,
					struct kvshm_key k)
{
	return (uint32_t)(k.hi >> 32) & (h->geo.n_buckets - 1);
}

/*
 * Reader side, inline: this is the client's hot path (liburing keeps its
 * hot helpers in the header for the same reason). Entry fields are read
 * with relaxed atomics so the race with the writer is defined behaviour;
 * the seqcount's acquire loads and fence order them.
 */
static inline void kvshm_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#endif
}

static inline struct kvshm_bucket *kvshm_bucket_at(const struct kvshm_header *h,
						   uint32_t i)
{
	return &kvshm_buckets(h)[i & (h->geo.n_buckets - 1)];
}

/* Odd-seq retries before a reader gives up on a bucket: a daemon killed in
 * the middle of a write leaves the count odd for ever, and a lookup must
 * then miss, not spin. A live writer holds it odd for nanoseconds. */
#define KVSHM_SEQ_TRIES (1u << 20)

/* Reader: the ref of k in bucket b (0 if absent) and b's spill count. */
static inline __attribute__((always_inline)) uint32_t kvshm_bucket_find(const struct kvshm_bucket *b,
					 struct kvshm_key k, uint32_t *spill)
{
	uint32_t s, ref, sp, tries = 0;
	int j;

	for (;;) {
		s = atomic_load_explicit(&b->seq, memory_order_acquire);
		if (s & 1) {
			if (++tries == KVSHM_SEQ_TRIES) {
				*spill = 0;
				return 0;	/* a miss */
			}
			kvshm_cpu_relax();
			continue;
		}
		/* Every entry compared, with no branch: a select per entry
		 * (the lookup's one probe of a short request). */
		ref = 0;
#pragma GCC unroll 4
		for (j = 0; j < KVSHM_BUCKET_ENTRIES; j++) {
			uint32_t r = __atomic_load_n(&b->e[j].ref, __ATOMIC_RELAXED);
			unsigned hit = (unsigned)(r != 0) &
				       (unsigned)(__atomic_load_n(&b->e[j].tag, __ATOMIC_RELAXED) ==
						  k.lo) &
				       (unsigned)(__atomic_load_n(&b->e[j].check, __ATOMIC_RELAXED) ==
						  (uint32_t)k.hi);

			ref = hit ? r : ref;
		}
		sp = __atomic_load_n(&b->spill, __ATOMIC_RELAXED);
		atomic_thread_fence(memory_order_acquire);
		if (atomic_load_explicit(&b->seq, memory_order_relaxed) == s)
			break;
	}
	*spill = sp;
	return ref;
}

/*
 * Reader: where the index says key k lives, or UINT32_MAX: a page index
 * (tier 0), or KVSHM_LOC_SLOT | slot (tier 1, kvshm_loc_is_slot). The
 * result is a candidate only: the caller must verify the page or slot
 * entry. kvshm_view_find takes the header's fields from a view (a walk's).
 */
static inline __attribute__((always_inline)) uint32_t kvshm_view_find(const struct kvshm_view *v,
								      struct kvshm_key k)
{
	uint32_t home = (uint32_t)(k.hi >> 32) & v->bucket_mask, spill, ref, i;

	ref = kvshm_bucket_find(&v->buckets[home], k, &spill);
	for (i = 1; !ref && spill && i < KVSHM_PROBE_MAX; i++) {
		uint32_t unused;

		ref = kvshm_bucket_find(&v->buckets[(home + i) & v->bucket_mask], k, &unused);
	}
	return ref ? ref - 1 : UINT32_MAX;
}

static inline __attribute__((always_inline)) uint32_t kvshm_index_find(const struct kvshm_header *h,
					struct kvshm_key k)
{
	struct kvshm_view v = kvshm_view(h);

	return kvshm_view_find(&v, k);
}

/* Reader: prefetch the home bucket of k. */
static inline __attribute__((always_inline)) void kvshm_view_prefetch(const struct kvshm_view *v, struct kvshm_key k)
{
	__builtin_prefetch(&v->buckets[(uint32_t)(k.hi >> 32) & v->bucket_mask], 0, 3);
}

static inline __attribute__((always_inline)) void kvshm_index_prefetch(const struct kvshm_header *h,
					struct kvshm_key k)
{
	__builtin_prefetch(kvshm_bucket_at(h, kvshm_index_home(h, k)), 0, 3);
}

/*
 * Writer: add k -> loc (a page, or KVSHM_LOC_SLOT | slot). Returns 0,
 * -EEXIST if k is already present, or -ENOSPC if no bucket within the
 * probe window has room.
 */
int kvshm_index_insert(struct kvshm_header *h, struct kvshm_key k,
		       uint32_t loc);

/* Writer: remove k -> loc. Returns 0 or -ENOENT. */
int kvshm_index_remove(struct kvshm_header *h, struct kvshm_key k,
		       uint32_t loc);

/*
 * Writer: point k's entry, which names `from`, at `to` instead, in place
 * (one bucket write: a reader sees the old or the new location, and the
 * key is never absent in between). Returns 0 or -ENOENT.
 */
int kvshm_index_move(struct kvshm_header *h, struct kvshm_key k,
		     uint32_t from, uint32_t to);

#endif
