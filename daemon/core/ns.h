/* SPDX-License-Identifier: MIT */
/*
 * ns.h - the namespace table (ns.c).
 */
#ifndef KVD_NS_H
#define KVD_NS_H

#include "kvd.h"

/*
 * Find or add the namespace `want` (identity fields and id filled); returns
 * its row, or -1 when the table is full. With may_reclaim, the row of a
 * namespace without clients is taken over (its pages evicted) when no row
 * is free.
 */
int kvd_ns_get(struct kvd *d, const struct kvshm_ns *want, bool may_reclaim);

#endif
