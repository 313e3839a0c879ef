/* SPDX-License-Identifier: MIT */
/*
 * memcheck.h - how much memory kvcached may take before the kernel's OOM
 * killer steps in, checked before the pool is touched.
 *
 * A pool larger than that would not fail cleanly: faulting in a memfd
 * in a small memory cgroup invokes the cgroup's OOM killer (which
 * may pick another process first), and past MemAvailable the whole host
 * starts killing. So the daemon compares what it is about to reserve with
 * the least of MemAvailable and, for every memory cgroup above it (v2
 * memory.max, v1 memory.limit_in_bytes), the limit minus current usage,
 * and refuses, naming the setting, before it reserves anything.
 */
#ifndef KVD_MEMCHECK_H
#define KVD_MEMCHECK_H

#include <stddef.h>
#include <stdint.h>

/*
 * Bytes available to this process; `what` (may be NULL) gets where the
 * bound comes from ("MemAvailable", "cgroup /a/b memory.max"). Returns 0,
 * or -ENOENT when nothing could be read (then *avail is UINT64_MAX).
 */
int kvd_mem_available(uint64_t *avail, char *what, size_t what_len);

/* Free hugetlb bytes of the default huge page size (0 if none). */
uint64_t kvd_hugetlb_free(void);

/* Parse the same sources from text, for tests and the fuzzer: the value
 * of a cgroup limit file ("max" or bytes). 0 or -EINVAL. */
int kvd_mem_parse_limit(const char *text, uint64_t *out);

#endif
