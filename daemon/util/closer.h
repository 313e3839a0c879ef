/* SPDX-License-Identifier: MIT */
/*
 * closer.h - closing what a client controls, off the event loop.
 *
 * close() can block for as long as a client likes: the last reference to
 * a TCP socket with SO_LINGER and unsent data waits for the linger time,
 * a FUSE file waits for its server's FLUSH reply. A client can hand the
 * daemon such a file inside any message (SCM_RIGHTS), and the daemon's own
 * end of a client connection drops every file still queued on it when it
 * is closed. So the event loop never closes a client's connection or a
 * descriptor a client sent: it hands them to closer threads, which drain
 * what is queued (taking the descriptors out), defuse lingering sockets,
 * and close. The loop only takes a mutex for a queue push.
 */
#ifndef KVD_CLOSER_H
#define KVD_CLOSER_H

#include <stdbool.h>
#include <stdint.h>

/*
 * Close fd on a closer thread. drain: fd is a client connection: first
 * shut down its reading side (nothing more can be queued), then read out
 * a bounded amount of what is queued (so the ERROR just sent is not lost
 * to a reset) and close every descriptor that came with it. Never blocks
 * on the descriptor; falls back to closing here only when no thread can
 * be started and memory for the queue is gone.
 */
void kvd_closer_put(int fd, bool drain);

/* Descriptors a client sent us (counted), already taken out of the
 * message: closed on a closer thread, sockets first made not to linger. */
void kvd_closer_passed(const int *fds, int n);

/* Descriptors clients have sent, ever (they are never used). */
uint64_t kvd_closer_passed_total(void);

/* Wait until every queued descriptor is closed (tests, shutdown);
 * gives up after timeout_ms and returns false. */
bool kvd_closer_flush(int timeout_ms);

#endif
