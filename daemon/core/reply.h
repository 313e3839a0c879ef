/* SPDX-License-Identifier: MIT */
/*
 * reply.h - what a handler sends a client, and ending its connection (reply.c).
 */
#ifndef KVD_REPLY_H
#define KVD_REPLY_H

#include "kvd.h"

/*
 * A frame's handler: the handler column of the frame table
 * (KVPROTO_FRAMES, shm/proto.h), run by the dispatch (server.c) on a
 * frame kvproto_decode passed: hdr, then its hdr->len payload bytes at p.
 * Returns 0, or -1 when c is closing or done (nothing more is read).
 */
typedef int kvd_frame_fn(struct kvd *d, struct kvd_client *c, const struct kvproto_hdr *hdr,
			 const void *p);

/* epoll_ctl on d's epoll set, tag in data.u64. */
int kvd_ep_set(struct kvd *d, int op, int fd, uint32_t events, uint64_t tag);
/* Queue a reply; 0, or -1 when the client is closing (its send failed). */
int kvd_reply(struct kvd *d, struct kvd_client *c, uint16_t type, uint32_t seq,
	      const void *p1, uint32_t n1, const void *p2, uint32_t n2);
/* Send what is queued; -1 when the peer is gone. */
int kvd_client_flush(struct kvd *d, struct kvd_client *c);
/* End c's connection: the event loop drops it when the handler returns
 * (a BYE: everything it held goes at once). The first reason stands. */
void kvd_client_close(struct kvd *d, struct kvd_client *c, const char *why, bool bye);
/* A restore is parked on c: read nothing more from it until its reply
 * (only a hang-up is noticed meanwhile); resume once the reply is sent. */
void kvd_client_park(struct kvd *d, struct kvd_client *c);
void kvd_client_resume(struct kvd *d, struct kvd_client *c);
/* BYE (a frame handler): end the connection, releasing all at once. */
kvd_frame_fn kvd_client_bye;
/* Send an ERROR; fatal ones end the connection (kvd_client_close). */
void kvd_reply_error(struct kvd *d, struct kvd_client *c, uint32_t seq,
		     int err, bool fatal, const char *fmt, ...)
	__attribute__((format(printf, 6, 7)));

#endif
