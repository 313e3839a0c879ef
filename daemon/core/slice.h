/* SPDX-License-Identifier: MIT */
/*
 * slice.h - pages that several tensor-parallel ranks write together.
 *
 * A page holds every KV head of a model (shm/proto.h, kvproto_part); an
 * engine at tensor-parallel size N > 1 has each rank hold some of them,
 * so its ranks write one page together, each its own slice of the heads.
 * The first rank to ask for a block gets a fresh page, announced in flight
 * under the block's key (single flight, page.h); each other rank of the
 * same slice count that asks for that block is granted the same page for
 * its slice (it *joins*). A slice published is in; the page is published
 * (READY, indexed, in the eviction order) when its last slice is, by the
 * caller of kvd_slice_written (publish.c). Until then the daemon keeps a
 * record per page: who was granted each slice, which are written, when it
 * began.
 *
 * A page that cannot be whole is given up: a rank that frees its slice
 * unwritten or whose process dies, or a slice nobody asked for within
 * slice-timeout-ms (a rank whose grant stopped short, or that never came).
 * The announcement ends at once (waiters get a miss); the page itself is
 * freed once no rank still holds its slice open (their PUBLISH or FREE of
 * it is then answered -ESTALE: a miss, not a lie), so no rank ever writes
 * into a page handed to someone else.
 *
 * Cost: the records are daemon memory, one per page being written by
 * several ranks (bounded by the pin slots); the tick looks only at the
 * oldest records, in order, and stops at the first that is not due.
 */
#ifndef KVD_SLICE_H
#define KVD_SLICE_H

#include <stdbool.h>
#include <stdint.h>

#include "kvd.h"

/* The record table (n_pages pointers, NULL until a page has one). */
int kvd_slice_init(struct kvd *d);
void kvd_slice_fini(struct kvd *d);

/* Does c write slices of pages several ranks write? */
static inline bool kvd_slicing(const struct kvd_client *c)
{
	return c->part.writers > 1;
}

/*
 * A page for c's slice of the block claimed: the page another rank of c's
 * slice count began for it whose slice c is free (joined), else a fresh
 * page, announced. Returns 0 with *out set, or the KVPROTO_SHORT_* reason
 * why no page can be granted for this block (and so for none after it):
 * KVPROTO_SHORT_TAKEN (the block is cached, or in flight by writers of
 * another layout or with c's slice taken), KVPROTO_SHORT_POOL (no free page,
 * no room to announce, out of memory). `announce`: c may announce one
 * more page (max-announced).
 */
uint32_t kvd_slice_grant(struct kvd *d, struct kvd_client *c, const struct kvproto_claim *cl,
			 bool announce, struct kvproto_pg *out);

/* Would kvd_slice_grant join a page for this block (no free page used)? */
bool kvd_slice_joinable(const struct kvd *d, const struct kvd_client *c,
			const struct kvproto_claim *cl);

/*
 * A PUBLISH or FREE record of a slicing client naming (page, gen), with
 * the key it publishes (NULL for FREE): 0 c holds that slice open (and
 * the key is the page's block), 1 c held it but the page was given up (a
 * miss: answer -ESTALE, then kvd_slice_release), -1 c holds no such
 * slice (the client lies).
 */
int kvd_slice_check(const struct kvd *d, const struct kvd_client *c, uint32_t page,
		    uint32_t gen, const struct kvshm_key *key);

/*
 * c published its slice of page (checked with kvd_slice_check: 0):
 * returns true when that was the last slice (publish the page for its
 * owner, then kvd_slice_forget), false when others are still to come.
 */
bool kvd_slice_written(struct kvd *d, const struct kvd_client *c, uint32_t page);

/*
 * c ends its open slice of page unwritten (FREE, its process gone, the
 * page punched out, or a publish of a page given up): the page is given
 * up if it was not already, and freed once no slice of it is open.
 */
void kvd_slice_release(struct kvd *d, const struct kvd_client *c, uint32_t page);

/* The owner ids of the slices of page granted and not yet published,
 * into owners[] (KVSHM_MAX_WRITERS room); returns how many (0: no record).
 * For checks that every client's WRITING count is what it holds. */
uint32_t kvd_slice_open(const struct kvd *d, uint32_t page, uint32_t *owners);

/* Does c hold a slice of page open (granted, not published: reclaim)? */
bool kvd_slice_holds(const struct kvd *d, const struct kvd_client *c, uint32_t page);

/* Has page a record (written by several ranks, still WRITING)? */
bool kvd_slice_is(const struct kvd *d, uint32_t page);

/* The page left WRITING as a whole (published, or freed by the publish):
 * drop its record. */
void kvd_slice_forget(struct kvd *d, uint32_t page);

/* Give up the pages whose slices did not all come within
 * slice-timeout-ms: the oldest records only, stopping at the first not
 * due. */
void kvd_slice_tick(struct kvd *d);

#endif
