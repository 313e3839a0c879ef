// SPDX-License-Identifier: MIT
/*
 * mapping.c - shared mappings at a 2 MiB boundary (see mapping.h).
 */
#include <errno.h>
#include <stddef.h>
#include <sys/mman.h>

#include "mapping.h"

void *kvshm_map(int fd, uint64_t bytes, int prot)
{
	char *room, *at;
	void *p;

	if (bytes < KVSHM_HUGE_BYTES) {
		p = mmap(NULL, bytes, prot, MAP_SHARED, fd, 0);
		return p == MAP_FAILED ? NULL : p;
	}
	/* Reserve 2 MiB more address space than needed (no memory: an
	 * inaccessible private mapping), map the file over its first 2 MiB
	 * boundary, and give back what is left on either side. */
	room = mmap(NULL, bytes + KVSHM_HUGE_BYTES, PROT_NONE,
		    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (room == MAP_FAILED)
		return NULL;
	at = (char *)(((uintptr_t)room + KVSHM_HUGE_BYTES - 1) & ~(uintptr_t)(KVSHM_HUGE_BYTES - 1));
	p = mmap(at, bytes, prot, MAP_SHARED | MAP_FIXED, fd, 0);
	if (p == MAP_FAILED) {
		int e = errno;

		munmap(room, bytes + KVSHM_HUGE_BYTES);
		errno = e;
		return NULL;
	}
	if (at > room)
		munmap(room, (size_t)(at - room));
	if (room + KVSHM_HUGE_BYTES > at)
		munmap(at + bytes, (size_t)(room + KVSHM_HUGE_BYTES - at));
	return p;
}
