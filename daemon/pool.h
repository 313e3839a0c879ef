/* SPDX-License-Identifier: MIT */
/*
 * pool.h - the page pool backends. A pool is `n_pages` slots of
 * `page_bytes`, exported to clients as file descriptors; page i lives at
 * base + i * page_bytes in every process that maps it.
 */
#ifndef KVD_POOL_H
#define KVD_POOL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "../shm/segment.h"
#include "config.h"
#include "memfd.h"

struct kvd_pool {
	enum kvshm_pool_kind kind;
	struct kvd_memfd mem;	/* host pool */
	uint64_t bytes;
	pthread_t prefault_thread;
	bool prefaulting;
	atomic_bool stop_prefault;
};

/*
 * Host pool: a memfd of `bytes`, hugetlb pages when the mode allows and
 * some are reserved, else normal pages with transparent-hugepage advice
 * and one log line saying so. Sealed against growing and shrinking so a
 * client cannot make the daemon's mapping fault. Returns 0 or -errno,
 * having logged the reason.
 */
int kvd_pool_host_open(struct kvd_pool *p, uint64_t bytes, enum kvd_hugepages mode);

/* Fault the whole pool in on a background thread (see pool_host.c). */
void kvd_pool_prefault(struct kvd_pool *p);

/* The fd handed to clients. */
int kvd_pool_fd(const struct kvd_pool *p);

void kvd_pool_close(struct kvd_pool *p);

#endif
