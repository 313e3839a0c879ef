// SPDX-License-Identifier: MIT
/*
 * memfd.c - memfd creation, reservation, mapping and sealing.
 */
#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "memfd.h"

int kvd_memfd_create(struct kvd_memfd *m, const char *name, uint64_t bytes,
		     bool huge)
{
	unsigned int fl = MFD_CLOEXEC | MFD_ALLOW_SEALING;
	int rc;

	m->fd = -1;
	m->base = NULL;
	m->bytes = bytes;
	m->huge = huge;
	if (huge)
		fl |= MFD_HUGETLB;
	m->fd = memfd_create(name, fl);
	if (m->fd < 0)
		return -errno;
	if (ftruncate(m->fd, (off_t)bytes)) {
		rc = -errno;
		goto out_close;
	}
	rc = posix_fallocate(m->fd, 0, (off_t)bytes);
	if (rc) {
		rc = -rc;
		goto out_close;
	}
	m->base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, m->fd, 0);
	if (m->base == MAP_FAILED) {
		m->base = NULL;
		rc = -errno;
		goto out_close;
	}
	return 0;

out_close:
	close(m->fd);
	m->fd = -1;
	return rc;
}

int kvd_memfd_seal(struct kvd_memfd *m, int seals)
{
	return fcntl(m->fd, F_ADD_SEALS, seals) ? -errno : 0;
}

void kvd_memfd_close(struct kvd_memfd *m)
{
	if (m->base)
		munmap(m->base, m->bytes);
	if (m->fd >= 0)
		close(m->fd);
	m->base = NULL;
	m->fd = -1;
}
