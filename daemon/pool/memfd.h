/* SPDX-License-Identifier: MIT */
/*
 * memfd.h - anonymous shared memory for the segment, the pool and ledgers.
 * Never a name in /dev/shm: only file descriptors, handed out over the
 * socket, so nothing can be squatted or opened by a stranger.
 */
#ifndef KVD_MEMFD_H
#define KVD_MEMFD_H

#include <stdbool.h>
#include <stdint.h>

struct kvd_memfd {
	int fd;
	void *base;
	uint64_t bytes;
	bool huge;
};

/*
 * Create a sealable memfd of `bytes`, reserve its memory up front
 * (fallocate, so a short memory limit fails here and not as SIGBUS later)
 * and map it read-write. `huge`: MFD_HUGETLB (bytes must be a multiple of
 * 2 MiB). Returns 0 or -errno; on error *m is closed.
 */
int kvd_memfd_create(struct kvd_memfd *m, const char *name, uint64_t bytes,
		     bool huge);

/* Add seals (F_SEAL_*). Returns 0 or -errno. */
int kvd_memfd_seal(struct kvd_memfd *m, int seals);

void kvd_memfd_close(struct kvd_memfd *m);

#endif
