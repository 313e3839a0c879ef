/* SPDX-License-Identifier: MIT */
/*
 * hostmap.h - a host pool shared with GPU engines (hostmap.c): the pool
 * registered with CUDA in chunks by a thread of its own, and the GPUs this
 * process copies on. Private to libclient (client.c, gpu.c).
 */
#ifndef KVC_HOSTMAP_H
#define KVC_HOSTMAP_H

#include <stdbool.h>
#include <stdint.h>

#include "client_int.h"

#ifdef KVC_HAVE_CUDA
#include <cuda.h>

#include "../kernels/page_cuda.h"

/* One GPU copies run on: its primary context and the kernels in it. */
struct kvc_hostdev {
	CUdevice dev;
	int ordinal;
	CUcontext ctx;			/* retained */
	struct kvk_module mod;
	struct kvk_check_cache cache;
	atomic_bool ok;			/* all of the above is set (release) */
};

/*
 * The GPU `device`, prepared (kvc_hostmap_prepare) if it was not: NULL
 * with *rc = -errno where it cannot be.
 */
struct kvc_hostdev *kvc_hostmap_dev(kvc_t *c, int device, int *rc);
#endif

/*
 * kvc_gpu_prepare on a host pool: the device's context and kernels, and
 * (first call) the registration thread. 0 or -errno, the reason kept for
 * kvc_hostmap_status.
 */
int kvc_hostmap_prepare(kvc_t *c, int device, uint32_t flags);

/* Can kernels address pool bytes [off, off + len) (registered)? Acquire:
 * a true answer is after the registration it reports. */
bool kvc_hostmap_registered(const kvc_t *c, uint64_t off, uint64_t len);

/* kvc_gpu_status on a host pool. */
void kvc_hostmap_status(const kvc_t *c, struct kvc_gpu_status *st);

/* Wait for every copy queued on the GPUs this handle used (before BYE). */
void kvc_hostmap_quiesce(kvc_t *c);

/* Stop the thread, unregister the pool, release the GPUs (before the pool
 * is unmapped); in a child after fork, only free the memory. */
void kvc_hostmap_close(kvc_t *c);

#endif
