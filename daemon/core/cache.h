/* SPDX-License-Identifier: MIT */
/*
 * cache.h - ALLOC, ALLOC_KEYS, PUBLISH and FREE (cache.c).
 */
#ifndef KVD_CACHE_H
#define KVD_CACHE_H

#include "reply.h"

/* ALLOC, PUBLISH, FREE. Return 0, or -1 if c is closing. */
kvd_frame_fn kvd_cache_alloc;
kvd_frame_fn kvd_cache_publish;
kvd_frame_fn kvd_cache_free;
/* Pages one process may hold pinned or writing: max-share of the pool. */
uint32_t kvd_share_pages(const struct kvd *d);
/* Give back every WRITING page of client c; returns how many. */
uint32_t kvd_cache_reclaim(struct kvd *d, const struct kvd_client *c);

/* ALLOC_KEYS (ALLOC with the blocks' keys: announced pages). */
kvd_frame_fn kvd_cache_alloc_keys;

#endif
