/* SPDX-License-Identifier: MIT */
/*
 * alloc.h - ALLOC and ALLOC_KEYS (alloc.c).
 */
#ifndef KVD_ALLOC_H
#define KVD_ALLOC_H

#include "reply.h"

/* ALLOC; ALLOC_KEYS (ALLOC with the blocks' keys: announced pages).
 * Return 0, or -1 if c is closing. */
kvd_frame_fn kvd_alloc;
kvd_frame_fn kvd_alloc_keys;
/* Pages one process may hold pinned or writing: max-share of the pool. */
uint32_t kvd_share_pages(const struct kvd *d);

#endif
