/* SPDX-License-Identifier: MIT */
/*
 * memfd.h - anonymous shared memory for the segment, the pool and ledgers.
 * Never a name in /dev/shm: only file descriptors, handed out over the
 * socket, so nothing can be squatted or opened by a stranger.
 */
#ifndef KVD_MEMFD_H
#define KVD_MEMFD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* What a memfd's memory is made of. */
enum kvd_mem_kind {
	KVD_MEM_SMALL = 0,	/* normal 4 KiB pages */
	KVD_MEM_THP,		/* normal (shmem) memory to be faulted in as
				 * 2 MiB transparent huge pages by
				 * kvd_memfd_fill */
	KVD_MEM_HUGETLB,	/* MFD_HUGETLB: 2 MiB pages of the hugetlb
				 * pool, reserved by the daemon's mapping */
};

struct kvd_memfd {
	int fd;
	void *base;
	uint64_t bytes;
	enum kvd_mem_kind kind;
};

/*
 * Create a sealable memfd of `bytes` and map it read-write at a 2 MiB
 * boundary (shm/mapping.h). HUGETLB (bytes a multiple of 2 MiB): the
 * shared mapping reserves the huge pages, -ENOMEM when too few are
 * reserved or may be overcommitted. THP: advised MADV_HUGEPAGE. Normal
 * memory is not reserved yet: the caller reserves it, either by faulting
 * it all in (kvd_memfd_fill: the pool and the segment) or with
 * kvd_memfd_reserve, so that a short memory limit fails at once and not
 * as SIGBUS later. Returns 0 or -errno; on error *m is closed.
 */
int kvd_memfd_create(struct kvd_memfd *m, const char *name, uint64_t bytes,
		     enum kvd_mem_kind kind);

/*
 * Reserve a SMALL memfd's memory without faulting it in (fallocate: the
 * pages are zeroed on first touch). Not for THP, whose memory fallocate
 * would reserve as 4 KiB pages before any fault could take a 2 MiB page.
 * 0 or -errno.
 */
int kvd_memfd_reserve(struct kvd_memfd *m);

/* What kvd_memfd_fill did. */
struct kvd_memfd_fill {
	uint64_t ns;		/* wall-clock time it took */
	uint64_t cpu_ns;	/* CPU time this process spent meanwhile */
	uint32_t threads;	/* threads that faulted pages in */
	uint64_t collapsed;	/* THP: 2 MiB frames that became huge pages */
	int collapse_err;	/* THP: errno of the first frame that did not, or 0 */
};

/*
 * Fault every page of m in, on up to `threads` threads (0: one per CPU
 * this process may run on, at most 16), each taking 64 MiB at a time.
 * Only before anyone else maps m: it may write zeros (kernels without
 * MADV_POPULATE_WRITE). A THP memfd is made 2 MiB frame by 2 MiB frame:
 * one 4 KiB fault (a whole 2 MiB page where shmem_enabled gives one at
 * fault time), then MADV_COLLAPSE, which makes a 2 MiB page of the rest
 * whatever shmem_enabled says short of `deny`; a frame the kernel does
 * not collapse (no free 2 MiB of memory, a kernel before 6.1) is
 * faulted in as 4 KiB pages, and after 64 such frames in a row, or one
 * EINVAL, collapsing stops. Returns 0 or -errno (-ENOMEM: the memory
 * is not there), filling *out either way.
 */
int kvd_memfd_fill(struct kvd_memfd *m, uint32_t threads, struct kvd_memfd_fill *out);

/*
 * Bytes of m's mapping in this process that the kernel maps as 2 MiB
 * pages (/proc/self/smaps: ShmemPmdMapped, FilePmdMapped, Shared_Hugetlb
 * and Private_Hugetlb of its VMAs). One read of smaps, which walks this
 * process's page tables: a start-up check, not a per-tick one. 0 or
 * -errno.
 */
int kvd_memfd_huge_bytes(const struct kvd_memfd *m, uint64_t *out);

/*
 * The kernel's shmem transparent-huge-page policy, the bracketed word of
 * /sys/kernel/mm/transparent_hugepage/shmem_enabled ("always",
 * "within_size", "advise", "never", "deny", "force"), into buf; "" when
 * the kernel has none (no CONFIG_TRANSPARENT_HUGEPAGE).
 */
const char *kvd_thp_shmem_mode(char *buf, size_t len);

/* Add seals (F_SEAL_*). Returns 0 or -errno. */
int kvd_memfd_seal(struct kvd_memfd *m, int seals);

void kvd_memfd_close(struct kvd_memfd *m);

#endif
