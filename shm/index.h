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

#include "segment.h"

/* Home bucket of a key. */
static inline uint32_t kvshm_index_home(const struct kvshm_header *h,
					struct kvshm_key k)
{
	return (uint32_t)(k.hi >> 32) & (h->geo.n_buckets - 1);
}

/*
 * Reader: the page index the index holds for key k, or UINT32_MAX. The
 * result is a candidate only: the caller must verify the page entry.
 */
uint32_t kvshm_index_find(const struct kvshm_header *h, struct kvshm_key k);

/* Reader: prefetch the home bucket of k. */
void kvshm_index_prefetch(const struct kvshm_header *h, struct kvshm_key k);

/*
 * Writer: add k -> page. Returns 0, -EEXIST if k is already present, or
 * -ENOSPC if no bucket within the probe window has room.
 */
int kvshm_index_insert(struct kvshm_header *h, struct kvshm_key k,
		       uint32_t page);

/* Writer: remove k -> page. Returns 0 or -ENOENT. */
int kvshm_index_remove(struct kvshm_header *h, struct kvshm_key k,
		       uint32_t page);

#endif
