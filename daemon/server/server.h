/* SPDX-License-Identifier: MIT */
/*
 * server.h - the socket and the event loop, the one place a client is
 * dropped (server.c).
 */
#ifndef KVD_SERVER_H
#define KVD_SERVER_H

#include "../core/kvd.h"

/* Before anything is allocated: the socket path fits, its folder exists or
 * can be made (one level), and no live daemon serves it. `where` names the
 * setting in messages (kvd_config_where: "FILE:LINE: socket PATH"). 0,
 * -EINVAL (the setting cannot work) or -EADDRINUSE (a live daemon),
 * logged. */
int kvd_server_precheck(const struct kvd *d, const char *where);
int kvd_server_open(struct kvd *d);
int kvd_server_run(struct kvd *d);
void kvd_server_close(struct kvd *d);
/*
 * Decode and dispatch one complete frame (header and exactly its payload)
 * from client c. Returns 0, or -1 when c is closing or done. The server
 * calls it on c->in; the daemon_frames fuzz target calls it too, so that
 * it fuzzes the dispatch the daemon runs.
 */
int kvd_server_frame(struct kvd *d, struct kvd_client *c, const uint8_t *in);
/* Drop every client a handler marked closing (the loop, after each
 * handler; the fuzz target, after each step). */
void kvd_server_drop_closing(struct kvd *d);

#endif
