/* SPDX-License-Identifier: MIT */
/*
 * top.h - the top-prefix sketch (top.c).
 */
#ifndef KVD_TOP_H
#define KVD_TOP_H

#include "kvd.h"

/* Feed c's new hit records into the top-prefix sketch. */
void kvd_top_drain(struct kvd *d, struct kvd_client *c);
/* Empty the top-prefix sketch (a reset of the statistics). */
void kvd_top_reset(struct kvd *d);

#endif
