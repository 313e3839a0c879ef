/* SPDX-License-Identifier: MIT */
/*
 * admin.h - an operator's requests to a running daemon (admin.c).
 */
#ifndef KVD_ADMIN_H
#define KVD_ADMIN_H

#include "reply.h"

/*
 * Is c's peer (SO_PEERCRED at accept) root or the daemon's own user? If
 * not, c gets a fatal -EPERM naming `what` and both uids, counted as a
 * refused client: false.
 */
bool kvd_admin_allowed(struct kvd *d, struct kvd_client *c, uint32_t seq, const char *what);

/* ADMIN, before HELLO: drop a namespace's or a tenant's pages, pin a
 * prompt's prefix, unpin; then the connection ends, as after RESET. */
kvd_frame_fn kvd_admin_req;

#endif
