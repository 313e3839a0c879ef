/* SPDX-License-Identifier: MIT */
/*
 * mapping.h - mapping a shared memfd (the segment, the pool) so that the
 * kernel can map its 2 MiB pages whole.
 *
 * A 2 MiB page (hugetlb, or a shmem transparent huge page) is mapped by
 * one page-middle-directory entry only where the mapping's address and
 * the file offset agree modulo 2 MiB; the kernel picks such an address by
 * itself for hugetlb files, and for shmem only while shmem_enabled is not
 * `never`. Elsewhere a 2 MiB page is mapped as 512 small entries: every
 * process pays 8 bytes of page table per 4 KiB and a TLB entry per 4 KiB.
 * So every mapping of a memfd, in the daemon and in each client, goes
 * through here. Must never: map more or less than asked, or leave the
 * padding it reserves mapped.
 */
#ifndef KVSHM_MAPPING_H
#define KVSHM_MAPPING_H

#include <stdint.h>

#define KVSHM_HUGE_BYTES (2ull << 20)	/* the PMD size on x86-64 */

/*
 * mmap(MAP_SHARED) `bytes` of fd from offset 0 with `prot`, at an
 * address that is a multiple of 2 MiB when bytes is at least that.
 * Returns the address or NULL with errno set; munmap(addr, bytes)
 * undoes it.
 */
void *kvshm_map(int fd, uint64_t bytes, int prot);

#endif
