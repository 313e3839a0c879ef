// SPDX-License-Identifier: MIT
/*
 * memfd.c - memfd creation, reservation, mapping, faulting in and sealing.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25
#endif

#include "../../shm/mapping.h"
#include "memfd.h"

#define FILL_UNIT (64ull << 20)		/* what a fill thread takes at a time */
#define FILL_MAX_THREADS 16u
#define COLLAPSE_GIVE_UP 64u		/* refusals in a row that stop collapsing */

int kvd_memfd_create(struct kvd_memfd *m, const char *name, uint64_t bytes,
		     enum kvd_mem_kind kind)
{
	unsigned int fl = MFD_CLOEXEC | MFD_ALLOW_SEALING;
	int rc;

	m->fd = -1;
	m->base = NULL;
	m->bytes = bytes;
	m->kind = kind;
	if (kind == KVD_MEM_HUGETLB)
		fl |= MFD_HUGETLB;
	m->fd = memfd_create(name, fl);
	if (m->fd < 0)
		return -errno;
	if (ftruncate(m->fd, (off_t)bytes)) {
		rc = -errno;
		goto out_close;
	}
	m->base = kvshm_map(m->fd, bytes, PROT_READ | PROT_WRITE);
	if (!m->base) {
		rc = -errno;
		goto out_close;
	}
	if (kind == KVD_MEM_THP)
		madvise(m->base, bytes, MADV_HUGEPAGE);
	return 0;

out_close:
	close(m->fd);
	m->fd = -1;
	return rc;
}

struct fill {
	struct kvd_memfd *m;
	uint64_t units;
	_Atomic uint64_t next;		/* the next unit to take */
	_Atomic uint64_t collapsed;
	_Atomic uint32_t refusals;	/* MADV_COLLAPSE failures in a row */
	_Atomic int collapse_err;	/* errno of the first failure */
	_Atomic int err;		/* -errno that stops the fill */
};

static int fault_in(char *p, uint64_t len)
{
	uint64_t o;

	if (!madvise(p, len, MADV_POPULATE_WRITE))
		return 0;
	if (errno != EINVAL)
		return -errno;
	/* Before Linux 5.14: touch every page. The memory is fresh (zero)
	 * and nobody else maps it yet, so writing a zero changes nothing. */
	for (o = 0; o < len; o += 4096)
		((volatile char *)p)[o] = 0;
	return 0;
}

/* One 2 MiB frame (at most) of a THP memfd, at offset off. */
static int fill_frame(struct fill *f, uint64_t off, uint64_t len)
{
	char *p = (char *)f->m->base + off;
	int rc, e, none = 0;

	if (len < KVSHM_HUGE_BYTES || atomic_load(&f->refusals) >= COLLAPSE_GIVE_UP)
		return fault_in(p, len);
	/* MADV_COLLAPSE refuses a frame with no page at all: fault one in
	 * first. Where shmem_enabled gives 2 MiB pages at fault time (our
	 * mapping is advised), that fault takes the whole frame and the
	 * collapse finds it done. */
	rc = fault_in(p, 4096);
	if (rc)
		return rc;
	if (!madvise(p, len, MADV_COLLAPSE)) {
		atomic_fetch_add(&f->collapsed, 1);
		atomic_store(&f->refusals, 0);
		return 0;
	}
	e = errno;
	atomic_compare_exchange_strong(&f->collapse_err, &none, e);
	/* EINVAL: this kernel cannot (before 6.1, or shmem_enabled deny);
	 * else (ENOMEM, EAGAIN) no 2 MiB of free memory just now. */
	if (e == EINVAL)
		atomic_store(&f->refusals, COLLAPSE_GIVE_UP);
	else
		atomic_fetch_add(&f->refusals, 1);
	return fault_in(p, len);
}

static void *fill_worker(void *arg)
{
	struct fill *f = arg;
	uint64_t u, off, end, o;
	int rc = 0, none = 0;

	while (!rc && !atomic_load(&f->err) && (u = atomic_fetch_add(&f->next, 1)) < f->units) {
		off = u * FILL_UNIT;
		end = off + FILL_UNIT < f->m->bytes ? off + FILL_UNIT : f->m->bytes;
		if (f->m->kind != KVD_MEM_THP)
			rc = fault_in((char *)f->m->base + off, end - off);
		for (o = off; f->m->kind == KVD_MEM_THP && !rc && o < end; o += KVSHM_HUGE_BYTES)
			rc = fill_frame(f, o, end - o < KVSHM_HUGE_BYTES ? end - o : KVSHM_HUGE_BYTES);
	}
	if (rc)
		atomic_compare_exchange_strong(&f->err, &none, rc);
	return NULL;
}

/* User and system time of the whole process (the fill runs alone). */
static uint64_t cpu_ns(const struct rusage *r)
{
	return (uint64_t)(r->ru_utime.tv_sec + r->ru_stime.tv_sec) * 1000000000ull +
	       (uint64_t)(r->ru_utime.tv_usec + r->ru_stime.tv_usec) * 1000ull;
}

static uint32_t cpus_allowed(void)
{
	cpu_set_t set;
	int n;

	if (sched_getaffinity(0, sizeof(set), &set))
		return 1;
	n = CPU_COUNT(&set);
	return n > 0 ? (uint32_t)n : 1;
}

int kvd_memfd_fill(struct kvd_memfd *m, uint32_t threads, struct kvd_memfd_fill *out)
{
	struct fill f = { .m = m };
	pthread_t tid[FILL_MAX_THREADS];
	struct timespec t0, t1;
	struct rusage r0, r1;
	uint32_t n, i, started = 0;

	f.units = (m->bytes + FILL_UNIT - 1) / FILL_UNIT;
	n = threads ? threads : cpus_allowed();
	if (n > FILL_MAX_THREADS)
		n = FILL_MAX_THREADS;
	if (n > f.units)
		n = (uint32_t)f.units;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	getrusage(RUSAGE_SELF, &r0);
	/* This thread is one of the n. */
	for (i = 1; i < n; i++)
		if (!pthread_create(&tid[started], NULL, fill_worker, &f))
			started++;
	fill_worker(&f);
	for (i = 0; i < started; i++)
		pthread_join(tid[i], NULL);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	getrusage(RUSAGE_SELF, &r1);
	memset(out, 0, sizeof(*out));
	out->ns = (uint64_t)(t1.tv_sec - t0.tv_sec) * 1000000000ull + (uint64_t)t1.tv_nsec -
		  (uint64_t)t0.tv_nsec;
	out->cpu_ns = cpu_ns(&r1) - cpu_ns(&r0);
	out->threads = started + 1;
	out->collapsed = atomic_load(&f.collapsed);
	out->collapse_err = atomic_load(&f.collapse_err);
	return atomic_load(&f.err);
}

int kvd_memfd_huge_bytes(const struct kvd_memfd *m, uint64_t *out)
{
	static const char *const keys[] = { "ShmemPmdMapped:", "FilePmdMapped:",
					    "Shared_Hugetlb:", "Private_Hugetlb:" };
	uintptr_t lo = (uintptr_t)m->base, hi = lo + m->bytes;
	unsigned long s, e;
	unsigned long long kb;
	bool in = false;
	char line[4096];
	uint64_t sum = 0;
	size_t k;
	FILE *f;

	f = fopen("/proc/self/smaps", "re");
	if (!f)
		return -errno;
	while (fgets(line, sizeof(line), f)) {
		/* "start-end perms ..." opens a VMA; "Key:  N kB" follows. */
		if (sscanf(line, "%lx-%lx ", &s, &e) == 2) {
			in = s >= lo && e <= hi;
			continue;
		}
		for (k = 0; in && k < sizeof(keys) / sizeof(keys[0]); k++)
			if (!strncmp(line, keys[k], strlen(keys[k])) &&
			    sscanf(line + strlen(keys[k]), "%llu", &kb) == 1)
				sum += kb << 10;
	}
	fclose(f);
	*out = sum;
	return 0;
}

const char *kvd_thp_shmem_mode(char *buf, size_t len)
{
	char text[128], *a, *b;
	FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/shmem_enabled", "re");

	buf[0] = '\0';
	if (!f)
		return buf;
	if (fgets(text, sizeof(text), f) && (a = strchr(text, '[')) && (b = strchr(a, ']'))) {
		*b = '\0';
		snprintf(buf, len, "%s", a + 1);
	}
	fclose(f);
	return buf;
}

int kvd_memfd_reserve(struct kvd_memfd *m)
{
	int rc = posix_fallocate(m->fd, 0, (off_t)m->bytes);

	return -rc;
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
