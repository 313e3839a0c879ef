/* SPDX-License-Identifier: MIT */
/*
 * drop.h - DROP: a client gives up its namespace's blocks (drop.c).
 */
#ifndef KVD_DROP_H
#define KVD_DROP_H

#include "reply.h"

/* DROP from c: evict every unpinned block of c's namespace (pool
 * pages and spill slots). Returns 0, or -1 if c was dropped. */
kvd_frame_fn kvd_drop_ns;

#endif
