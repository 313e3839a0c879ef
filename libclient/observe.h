/* SPDX-License-Identifier: MIT */
/*
 * observe.h - attach to kvcached as an observer (kvstat, tests): one STAT
 * round trip for the segment fd, then read-only shared memory with no
 * further daemon round trip. Not part of the public API (kvclient.h):
 * these names are not exported from libkvclient.so.
 */
#ifndef KVC_OBSERVE_H
#define KVC_OBSERVE_H

#include <stddef.h>
#include <stdint.h>

#include "../shm/segment.h"

struct kvobs {
	const struct kvshm_header *h;	/* read-only mapping */
	uint64_t bytes;
};

/*
 * Attach through the socket at `path` (NULL: the default path). Returns 0,
 * or a negative errno with a sentence in err naming the problem: no daemon
 * at the path, not trusted, or a segment layout this build does not read.
 */
int kvobs_attach(const char *path, struct kvobs *o, char *err, size_t errlen);
void kvobs_detach(struct kvobs *o);

/*
 * Zero the daemon's statistics counters (RESET): allowed to root and the
 * daemon's own user. Returns 0, or a negative errno with a sentence in
 * err: -EPERM with the daemon's reason for anyone else, no daemon, or a
 * daemon that does not know RESET.
 */
int kvobs_reset(const char *path, char *err, size_t errlen);

/*
 * An operator's request (ADMIN: drop a namespace's or a tenant's pages,
 * pin a prompt's prefix with tokens[0..q->n_tokens), unpin): allowed to
 * root and the daemon's own user. Returns 0 with the reply in *r, or a
 * negative errno with a sentence in err (the daemon's reason when it
 * refused).
 */
struct kvproto_admin;
struct kvproto_admin_r;
int kvobs_admin(const char *path, const struct kvproto_admin *q, const uint32_t *tokens,
		struct kvproto_admin_r *r, char *err, size_t errlen);

#endif
