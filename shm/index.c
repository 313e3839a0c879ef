// SPDX-License-Identifier: MIT
/*
 * index.c - the shared hash index (see index.h for the shape).
 *
 * Readers run in client processes with a read-only mapping and take no
 * lock: each bucket is read under its seqcount and retried while a write is
 * in progress. All entry fields are accessed with relaxed atomics so the
 * race with the writer is defined behaviour (and visible to TSan); the
 * seqcount fences order them.
 */
#include <errno.h>

#include "index.h"

#define RELAXED __ATOMIC_RELAXED

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#endif
}

static inline struct kvshm_bucket *bucket(const struct kvshm_header *h, uint32_t i)
{
	return &kvshm_buckets(h)[i & (h->geo.n_buckets - 1)];
}

/* Reader: the ref of k in bucket b (0 if absent) and b's spill count. */
static uint32_t bucket_find(const struct kvshm_bucket *b, struct kvshm_key k,
			    uint32_t *spill)
{
	uint32_t s, ref, sp;
	int j;

	for (;;) {
		s = atomic_load_explicit(&b->seq, memory_order_acquire);
		if (s & 1) {
			cpu_relax();
			continue;
		}
		ref = 0;
		for (j = 0; j < KVSHM_BUCKET_ENTRIES; j++) {
			uint32_t r = __atomic_load_n(&b->e[j].ref, RELAXED);

			if (r && __atomic_load_n(&b->e[j].tag, RELAXED) == k.lo &&
			    __atomic_load_n(&b->e[j].check, RELAXED) == (uint32_t)k.hi)
				ref = r;
		}
		sp = __atomic_load_n(&b->spill, RELAXED);
		atomic_thread_fence(memory_order_acquire);
		if (atomic_load_explicit(&b->seq, memory_order_relaxed) == s)
			break;
	}
	*spill = sp;
	return ref;
}

uint32_t kvshm_index_find(const struct kvshm_header *h, struct kvshm_key k)
{
	uint32_t home = kvshm_index_home(h, k), spill, ref, i;

	ref = bucket_find(bucket(h, home), k, &spill);
	for (i = 1; !ref && spill && i < KVSHM_PROBE_MAX; i++) {
		uint32_t unused;

		ref = bucket_find(bucket(h, home + i), k, &unused);
	}
	return ref ? ref - 1 : UINT32_MAX;
}

void kvshm_index_prefetch(const struct kvshm_header *h, struct kvshm_key k)
{
	__builtin_prefetch(bucket(h, kvshm_index_home(h, k)), 0, 3);
}

/* Writer side of the seqcount. */
static void write_begin(struct kvshm_bucket *b)
{
	uint32_t s = atomic_load_explicit(&b->seq, memory_order_relaxed);

	atomic_store_explicit(&b->seq, s + 1, memory_order_relaxed);
	atomic_thread_fence(memory_order_release);
}

static void write_end(struct kvshm_bucket *b)
{
	uint32_t s = atomic_load_explicit(&b->seq, memory_order_relaxed);

	atomic_store_explicit(&b->seq, s + 1, memory_order_release);
}

int kvshm_index_insert(struct kvshm_header *h, struct kvshm_key k,
		       uint32_t page)
{
	uint32_t home = kvshm_index_home(h, k), i;
	int j;

	if (kvshm_index_find(h, k) != UINT32_MAX)
		return -EEXIST;
	for (i = 0; i < KVSHM_PROBE_MAX; i++) {
		struct kvshm_bucket *b = bucket(h, home + i);

		for (j = 0; j < KVSHM_BUCKET_ENTRIES; j++) {
			if (b->e[j].ref)
				continue;
			write_begin(b);
			__atomic_store_n(&b->e[j].tag, k.lo, RELAXED);
			__atomic_store_n(&b->e[j].check, (uint32_t)k.hi, RELAXED);
			__atomic_store_n(&b->e[j].ref, page + 1, RELAXED);
			write_end(b);
			if (i) {
				/* Entry first, then the hint that makes readers look. */
				struct kvshm_bucket *hb = bucket(h, home);

				write_begin(hb);
				__atomic_store_n(&hb->spill, hb->spill + 1, RELAXED);
				write_end(hb);
			}
			return 0;
		}
	}
	return -ENOSPC;
}

int kvshm_index_remove(struct kvshm_header *h, struct kvshm_key k,
		       uint32_t page)
{
	uint32_t home = kvshm_index_home(h, k), i;
	int j;

	for (i = 0; i < KVSHM_PROBE_MAX; i++) {
		struct kvshm_bucket *b = bucket(h, home + i);

		for (j = 0; j < KVSHM_BUCKET_ENTRIES; j++) {
			if (b->e[j].ref != page + 1 || b->e[j].tag != k.lo ||
			    b->e[j].check != (uint32_t)k.hi)
				continue;
			write_begin(b);
			__atomic_store_n(&b->e[j].ref, 0, RELAXED);
			__atomic_store_n(&b->e[j].tag, 0, RELAXED);
			__atomic_store_n(&b->e[j].check, 0, RELAXED);
			write_end(b);
			if (i) {
				struct kvshm_bucket *hb = bucket(h, home);

				write_begin(hb);
				__atomic_store_n(&hb->spill, hb->spill - 1, RELAXED);
				write_end(hb);
			}
			return 0;
		}
		if (!i && !bucket(h, home)->spill)
			break;
	}
	return -ENOENT;
}
