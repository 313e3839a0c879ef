/* SPDX-License-Identifier: MIT */
/*
 * remote.h - the remote tier (tier 2): blocks shared by every host of a
 * fleet through a pool of memcached servers (--remote), reached with
 * libmemcached on worker threads so that the main loop never waits on
 * the network. See remote.c for how a block is written, found and
 * fetched, and remote_item.h for the item format.
 */
#ifndef KVD_REMOTE_H
#define KVD_REMOTE_H

struct kvd_ground;

/*
 * Start the remote tier when cfg.remote names servers: read the secret
 * (refusing a file other users can read), configure libmemcached (ketama,
 * the timeout on every operation), start the workers, register the tier
 * and ask every server whether it answers (asynchronously: the tier
 * offers blocks once they do). Returns 0 (also when there is no remote
 * tier) or -1 after a log line.
 */
int kvd_remote_open(struct kvd_ground *g);

#endif
