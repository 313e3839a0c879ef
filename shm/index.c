// SPDX-License-Identifier: MIT
/*
 * index.c - the writer side of the shared hash index (see index.h for the
 * shape and for the reader side, which is inline there). Only the daemon's
 * main thread calls these. Every store to an entry is a relaxed atomic
 * inside the bucket's seqcount write section, so lock-free readers in other
 * processes see either the old or the new bucket, never a mix.
 */
#include <errno.h>

#include "index.h"

#define RELAXED __ATOMIC_RELAXED

int kvshm_index_insert(struct kvshm_header *h, struct kvshm_key k,
		       uint32_t page)
{
	uint32_t home = kvshm_index_home(h, k), i;
	int j;

	if (kvshm_index_find(h, k) != UINT32_MAX)
		return -EEXIST;
	for (i = 0; i < KVSHM_PROBE_MAX; i++) {
		struct kvshm_bucket *b = kvshm_bucket_at(h, home + i);

		for (j = 0; j < KVSHM_BUCKET_ENTRIES; j++) {
			if (b->e[j].ref)
				continue;
			kvshm_seq_write_begin(&b->seq);
			__atomic_store_n(&b->e[j].tag, k.lo, RELAXED);
			__atomic_store_n(&b->e[j].check, (uint32_t)k.hi, RELAXED);
			__atomic_store_n(&b->e[j].ref, page + 1, RELAXED);
			kvshm_seq_write_end(&b->seq);
			if (i) {
				/* Entry first, then the hint that makes readers look. */
				struct kvshm_bucket *hb = kvshm_bucket_at(h, home);

				kvshm_seq_write_begin(&hb->seq);
				__atomic_store_n(&hb->spill, hb->spill + 1, RELAXED);
				kvshm_seq_write_end(&hb->seq);
			}
			return 0;
		}
	}
	return -ENOSPC;
}

/* The bucket and entry of k -> page, or NULL. */
static struct kvshm_entry *entry_of(struct kvshm_header *h, struct kvshm_key k,
				    uint32_t page, struct kvshm_bucket **bucket,
				    uint32_t *probe)
{
	uint32_t home = kvshm_index_home(h, k), i;
	int j;

	for (i = 0; i < KVSHM_PROBE_MAX; i++) {
		struct kvshm_bucket *b = kvshm_bucket_at(h, home + i);

		for (j = 0; j < KVSHM_BUCKET_ENTRIES; j++) {
			if (b->e[j].ref != page + 1 || b->e[j].tag != k.lo ||
			    b->e[j].check != (uint32_t)k.hi)
				continue;
			*bucket = b;
			*probe = i;
			return &b->e[j];
		}
		if (!i && !kvshm_bucket_at(h, home)->spill)
			break;
	}
	return NULL;
}

int kvshm_index_move(struct kvshm_header *h, struct kvshm_key k,
		     uint32_t from, uint32_t to)
{
	struct kvshm_bucket *b;
	struct kvshm_entry *e;
	uint32_t probe;

	e = entry_of(h, k, from, &b, &probe);
	if (!e)
		return -ENOENT;
	kvshm_seq_write_begin(&b->seq);
	__atomic_store_n(&e->ref, to + 1, RELAXED);
	kvshm_seq_write_end(&b->seq);
	return 0;
}

int kvshm_index_remove(struct kvshm_header *h, struct kvshm_key k,
		       uint32_t page)
{
	struct kvshm_bucket *b;
	struct kvshm_entry *e;
	uint32_t probe;

	e = entry_of(h, k, page, &b, &probe);
	if (!e)
		return -ENOENT;
	kvshm_seq_write_begin(&b->seq);
	__atomic_store_n(&e->ref, 0, RELAXED);
	__atomic_store_n(&e->tag, 0, RELAXED);
	__atomic_store_n(&e->check, 0, RELAXED);
	kvshm_seq_write_end(&b->seq);
	if (probe) {
		struct kvshm_bucket *hb = kvshm_bucket_at(h, kvshm_index_home(h, k));

		kvshm_seq_write_begin(&hb->seq);
		__atomic_store_n(&hb->spill, hb->spill - 1, RELAXED);
		kvshm_seq_write_end(&hb->seq);
	}
	return 0;
}
