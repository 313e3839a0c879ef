/* SPDX-License-Identifier: MIT */
/*
 * publish.h - PUBLISH and FREE (publish.c).
 */
#ifndef KVD_PUBLISH_H
#define KVD_PUBLISH_H

#include "reply.h"

/* PUBLISH, FREE. Return 0, or -1 if c is closing. */
kvd_frame_fn kvd_publish;
kvd_frame_fn kvd_free;
/* Give back every WRITING page of client c; returns how many. */
uint32_t kvd_reclaim(struct kvd *d, const struct kvd_client *c);

#endif
