// SPDX-License-Identifier: MIT
/*
 * hostmap.c - a host pool shared with GPU engines. A page of a host pool
 * is plain shared memory (the daemon's memfd, mapped by every client):
 * CUDA does not know it, so a GPU can only reach it through copies the
 * driver stages, one per piece. Registered with cuMemHostRegister
 * (portable: every context; mapped: kernels address it, at the same
 * address under unified addressing), the page kernels read and write it
 * over the bus in one launch per request, as they do a cuda pool's pages.
 *
 * Registering pins the pages and costs about 0.1 s per GiB, so it is done
 * once per handle, by a thread of its own, in KVC_GPU_CHUNK chunks: the
 * engine asks for it when it has allocated its KV cache (kvc_gpu_prepare)
 * and attaching stays fast however large the pool. A copy before its
 * pages' chunks are registered goes the slow way for those pages
 * (kvk_copy_pieces, in gpu.c). What must never happen: a kernel touching
 * a page that is not registered (it would poison the engine's context),
 * so a chunk is marked ready only after its registration returned and the
 * device address was checked.
 *
 * Also the GPUs copies run on, by ordinal: each one's primary context
 * (the CUDA runtime's, so an engine's streams and events work as they
 * are) with the kernels loaded and warmed up in it.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hostmap.h"
#include "../kernels/cudadrv.h"

static void why_set(char *buf, size_t len, const char *fmt, const char *a, const char *b)
{
	snprintf(buf, len, fmt, a, b);
}

#ifdef KVC_HAVE_CUDA

/* GPUs one handle copies on, by ordinal. */
#define KVC_HOSTMAP_GPUS 64

struct kvc_hostmap {
	pthread_mutex_t lock;		/* preparing devs[], starting the thread, why (failures) */
	struct kvc_hostdev devs[KVC_HOSTMAP_GPUS];
	int reg_dev;			/* the device whose context registers; -1 */
	uint8_t *base;
	uint64_t bytes;
	uint32_t chunks;
	/* Written by the thread, read by copies and kvc_gpu_status. */
	atomic_uchar *ready;		/* [chunks]: 1 once registered (release) */
	atomic_uint n_ready;
	atomic_ullong ns;		/* time spent registering */
	atomic_int state;		/* enum kvc_gpu_state or -errno (release, after why) */
	atomic_bool stop;		/* kvc_close: the thread ends after its chunk */
	bool thread_on;
	pthread_t thread;
	char why[256];
};

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* A failure for kvc_gpu_status: the reason first, then the state. */
static void fail(struct kvc_hostmap *h, int rc, const char *fmt, const char *a, const char *b)
{
	why_set(h->why, sizeof(h->why), fmt, a, b);
	atomic_store_explicit(&h->state, rc, memory_order_release);
}

/* Why a device could not be prepared (lock held): the state says so only
 * while nothing registers. */
static void note(struct kvc_hostmap *h, int rc, const char *fmt, const char *a, const char *b)
{
	if (h->reg_dev >= 0)
		return;
	fail(h, rc, fmt, a, b);
}

static void *register_chunks(void *arg)
{
	struct kvc_hostmap *h = arg;
	char e[160], where[96];
	uint32_t k;

	if (kvk_cu.cuCtxSetCurrent(h->devs[h->reg_dev].ctx) != CUDA_SUCCESS) {
		fail(h, -EIO, "%s%s", "cuCtxSetCurrent failed in the registering thread", "");
		return NULL;
	}
	for (k = 0; k < h->chunks; k++) {
		uint64_t off = (uint64_t)k * KVC_GPU_CHUNK, t0 = now_ns();
		uint64_t len = h->bytes - off < KVC_GPU_CHUNK ? h->bytes - off : KVC_GPU_CHUNK;
		CUdeviceptr d = 0;
		CUresult r;

		if (atomic_load_explicit(&h->stop, memory_order_relaxed))
			return NULL;
		snprintf(where, sizeof(where), " (chunk %u of %u, %llu bytes at offset %llu)", k + 1,
			 h->chunks, (unsigned long long)len, (unsigned long long)off);
		r = kvk_cu.cuMemHostRegister(h->base + off, len,
					     CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP);
		if (r != CUDA_SUCCESS) {
			fail(h, r == CUDA_ERROR_OUT_OF_MEMORY ? -ENOMEM : -EIO,
			     "%s%s: pages of this chunk and after it are copied per piece (is the memory lock limit, ulimit -l, too low?)",
			     kvk_cu_err(r, "cuMemHostRegister", e, sizeof(e)), where);
			return NULL;
		}
		/* Kernels get the pool's own addresses: the mapping must
		 * be at the same address on the GPU (unified addressing,
		 * every 64-bit platform CUDA supports today). */
		r = kvk_cu.cuMemHostGetDevicePointer(&d, h->base + off, 0);
		if (r != CUDA_SUCCESS || d != (CUdeviceptr)(uintptr_t)(h->base + off)) {
			kvk_cu.cuMemHostUnregister(h->base + off);
			fail(h, -ENOTSUP, "%s%s: the GPU maps the pool at another address (no unified addressing): copies go per piece",
			     r != CUDA_SUCCESS ? kvk_cu_err(r, "cuMemHostGetDevicePointer", e, sizeof(e))
					       : "cuMemHostGetDevicePointer", where);
			return NULL;
		}
		atomic_fetch_add_explicit(&h->ns, now_ns() - t0, memory_order_relaxed);
		atomic_store_explicit(&h->ready[k], 1, memory_order_release);
		atomic_fetch_add_explicit(&h->n_ready, 1, memory_order_relaxed);
	}
	atomic_store_explicit(&h->state, KVC_GPU_READY, memory_order_release);
	return NULL;
}

static pthread_mutex_t create_lock = PTHREAD_MUTEX_INITIALIZER;

static struct kvc_hostmap *hostmap_of(const kvc_t *c)
{
	return atomic_load_explicit(&((kvc_t *)c)->hostmap, memory_order_acquire);
}

/* The handle's hostmap, made on first use. */
static struct kvc_hostmap *hostmap_get(kvc_t *c)
{
	struct kvc_hostmap *h = hostmap_of(c);
	int i;

	if (h)
		return h;
	pthread_mutex_lock(&create_lock);
	h = hostmap_of(c);
	if (h)
		goto out;
	h = calloc(1, sizeof(*h));
	if (!h)
		goto out;
	pthread_mutex_init(&h->lock, NULL);
	for (i = 0; i < KVC_HOSTMAP_GPUS; i++)
		pthread_mutex_init(&h->devs[i].cache.lock, NULL);
	h->reg_dev = -1;
	h->base = c->pool;
	h->bytes = c->pool_bytes;
	h->chunks = (uint32_t)((c->pool_bytes + KVC_GPU_CHUNK - 1) / KVC_GPU_CHUNK);
	h->ready = calloc(h->chunks ? h->chunks : 1, sizeof(*h->ready));
	if (!h->ready) {
		free(h);
		h = NULL;
		goto out;
	}
	atomic_store_explicit(&c->hostmap, h, memory_order_release);
out:
	pthread_mutex_unlock(&create_lock);
	return h;
}

/* Device `device`'s context and kernels (lock held). 0 or -errno. */
static int dev_open(struct kvc_hostmap *h, int device)
{
	struct kvc_hostdev *d;
	const char *why = NULL;
	char e[160], num[16];
	CUcontext old;
	CUresult r;
	int rc;

	snprintf(num, sizeof(num), "%d", device);
	if (device >= KVC_HOSTMAP_GPUS) {
		note(h, -ENODEV, "CUDA device %s: more than this library copies on%s", num, "");
		return -ENODEV;
	}
	d = &h->devs[device];
	if (atomic_load_explicit(&d->ok, memory_order_relaxed))
		return 0;
	if (kvk_cu.cuDeviceGet(&d->dev, device) != CUDA_SUCCESS) {
		note(h, -ENODEV, "no CUDA device %s in this process (CUDA_VISIBLE_DEVICES?)%s", num, "");
		return -ENODEV;
	}
	r = kvk_cu.cuDevicePrimaryCtxRetain(&d->ctx, d->dev);
	if (r != CUDA_SUCCESS) {
		note(h, -EIO, "%s%s", kvk_cu_err(r, "cuDevicePrimaryCtxRetain", e, sizeof(e)), "");
		return -EIO;
	}
	kvk_cu.cuCtxPushCurrent(d->ctx);
	rc = kvk_module_load(&d->mod, &why);
	kvk_cu.cuCtxPopCurrent(&old);
	if (rc) {
		kvk_cu.cuDevicePrimaryCtxRelease(d->dev);
		note(h, rc, "%s%s", why, "");
		return rc;
	}
	d->ordinal = device;
	/* Copies find the device without the lock. */
	atomic_store_explicit(&d->ok, true, memory_order_release);
	return 0;
}

int kvc_hostmap_prepare(kvc_t *c, int device, uint32_t flags)
{
	struct kvc_hostmap *h = hostmap_get(c);
	const char *why;
	sigset_t all, old;
	int rc;

	if (!h)
		return -ENOMEM;
	if (kvk_cuda_load(&why)) {
		pthread_mutex_lock(&h->lock);
		fail(h, -ENOTSUP, "%s%s", why, "");
		pthread_mutex_unlock(&h->lock);
		return -ENOTSUP;
	}
	pthread_mutex_lock(&h->lock);
	rc = dev_open(h, device);
	if (!rc && !h->thread_on && h->reg_dev < 0) {
		h->reg_dev = device;
		atomic_store_explicit(&h->state, h->chunks ? KVC_GPU_REGISTERING : KVC_GPU_READY,
				      memory_order_release);
		/* The thread takes none of the application's signals. */
		sigfillset(&all);
		pthread_sigmask(SIG_SETMASK, &all, &old);
		h->thread_on = !pthread_create(&h->thread, NULL, register_chunks, h);
		pthread_sigmask(SIG_SETMASK, &old, NULL);
		if (!h->thread_on) {
			fail(h, -EAGAIN, "%s%s", "cannot start the thread that registers the pool", "");
			rc = -EAGAIN;
		}
	}
	pthread_mutex_unlock(&h->lock);
	if (!rc && (flags & KVC_GPU_WAIT)) {
		/* Polled, not joined: kvc_close joins, and callers may wait
		 * from several threads. */
		struct timespec ms = { 0, 1000000 };

		while ((rc = atomic_load_explicit(&h->state, memory_order_acquire)) ==
		       KVC_GPU_REGISTERING)
			nanosleep(&ms, NULL);
		rc = rc < 0 ? rc : 0;
	}
	return rc;
}

struct kvc_hostdev *kvc_hostmap_dev(kvc_t *c, int device, int *rc)
{
	struct kvc_hostmap *h = hostmap_of(c);

	/* ok (acquire) says the device's context and kernels are there. */
	if (h && device < KVC_HOSTMAP_GPUS &&
	    atomic_load_explicit(&h->devs[device].ok, memory_order_acquire))
		return &h->devs[device];
	*rc = kvc_hostmap_prepare(c, device, 0);
	h = hostmap_of(c);
	if (h && device < KVC_HOSTMAP_GPUS &&
	    atomic_load_explicit(&h->devs[device].ok, memory_order_acquire)) {
		*rc = 0;	/* the device is there, even if the thread is not */
		return &h->devs[device];
	}
	*rc = *rc ? *rc : -EIO;
	return NULL;
}

bool kvc_hostmap_registered(const kvc_t *c, uint64_t off, uint64_t len)
{
	const struct kvc_hostmap *h = hostmap_of(c);
	uint64_t k, last;

	if (!h || !len)
		return false;
	last = (off + len - 1) / KVC_GPU_CHUNK;
	for (k = off / KVC_GPU_CHUNK; k <= last; k++)
		if (k >= h->chunks || !atomic_load_explicit(&h->ready[k], memory_order_acquire))
			return false;
	return true;
}

void kvc_hostmap_status(const kvc_t *c, struct kvc_gpu_status *st)
{
	struct kvc_hostmap *h = hostmap_of(c);
	uint32_t n;
	int state;

	st->chunks = (uint32_t)((c->pool_bytes + KVC_GPU_CHUNK - 1) / KVC_GPU_CHUNK);
	if (!h)
		return;
	state = atomic_load_explicit(&h->state, memory_order_acquire);
	st->state = state;
	st->device = h->reg_dev;
	n = atomic_load_explicit(&h->n_ready, memory_order_relaxed);
	st->chunks_registered = n;
	st->bytes_registered = (uint64_t)n * KVC_GPU_CHUNK < h->bytes ? (uint64_t)n * KVC_GPU_CHUNK
								       : h->bytes;
	st->register_ns = atomic_load_explicit(&h->ns, memory_order_relaxed);
	if (state < 0)
		snprintf(st->why, sizeof(st->why), "%s", h->why);
}

static void quiesce(struct kvc_hostmap *h)
{
	CUcontext old;
	int i;

	for (i = 0; i < KVC_HOSTMAP_GPUS; i++)
		if (atomic_load_explicit(&h->devs[i].ok, memory_order_acquire) &&
		    kvk_cu.cuCtxPushCurrent(h->devs[i].ctx) == CUDA_SUCCESS) {
			kvk_cu.cuCtxSynchronize();
			kvk_cu.cuCtxPopCurrent(&old);
		}
}

void kvc_hostmap_quiesce(kvc_t *c)
{
	struct kvc_hostmap *h = hostmap_of(c);

	if (h)
		quiesce(h);
}

void kvc_hostmap_close(kvc_t *c)
{
	struct kvc_hostmap *h = hostmap_of(c);
	CUcontext old;
	uint32_t k;
	int i;

	if (!h)
		return;
	atomic_store_explicit(&c->hostmap, NULL, memory_order_relaxed);
	/* A child of fork() has no thread and cannot use CUDA at all. */
	if (c->fork_gen != atomic_load_explicit(&kvc_fork_gen, memory_order_relaxed))
		goto out_free;
	if (h->thread_on) {
		atomic_store_explicit(&h->stop, true, memory_order_relaxed);
		pthread_join(h->thread, NULL);
	}
	quiesce(h);
	if (h->reg_dev >= 0 && kvk_cu.cuCtxPushCurrent(h->devs[h->reg_dev].ctx) == CUDA_SUCCESS) {
		for (k = 0; k < h->chunks; k++)
			if (atomic_load_explicit(&h->ready[k], memory_order_acquire))
				kvk_cu.cuMemHostUnregister(h->base + (uint64_t)k * KVC_GPU_CHUNK);
		kvk_cu.cuCtxPopCurrent(&old);
	}
	for (i = 0; i < KVC_HOSTMAP_GPUS; i++) {
		struct kvc_hostdev *d = &h->devs[i];

		if (!atomic_load_explicit(&d->ok, memory_order_relaxed))
			continue;
		kvk_cu.cuCtxPushCurrent(d->ctx);
		kvk_module_unload(&d->mod);
		kvk_cu.cuCtxPopCurrent(&old);
		kvk_cu.cuDevicePrimaryCtxRelease(d->dev);
	}
out_free:
	for (i = 0; i < KVC_HOSTMAP_GPUS; i++)
		kvk_check_cache_free(&h->devs[i].cache);
	free(h->ready);
	free(h);
}

#else

struct kvc_hostmap {
	char why[256];
};

int kvc_hostmap_prepare(kvc_t *c, int device, uint32_t flags)
{
	struct kvc_hostmap *h = atomic_load_explicit(&c->hostmap, memory_order_acquire);
	const char *why = NULL;

	(void)device, (void)flags;
	kvk_cuda_load(&why);
	if (!h && (h = calloc(1, sizeof(*h)))) {
		why_set(h->why, sizeof(h->why), "%s%s", why, "");
		struct kvc_hostmap *none = NULL;

		if (!atomic_compare_exchange_strong(&c->hostmap, &none, h))
			free(h);	/* another thread said it first: the same words */
	}
	return -ENOTSUP;
}

bool kvc_hostmap_registered(const kvc_t *c, uint64_t off, uint64_t len)
{
	(void)c, (void)off, (void)len;
	return false;
}

void kvc_hostmap_status(const kvc_t *c, struct kvc_gpu_status *st)
{
	struct kvc_hostmap *h = atomic_load_explicit(&((kvc_t *)c)->hostmap, memory_order_acquire);

	st->chunks = (uint32_t)((c->pool_bytes + KVC_GPU_CHUNK - 1) / KVC_GPU_CHUNK);
	if (!h)
		return;
	st->state = -ENOTSUP;
	snprintf(st->why, sizeof(st->why), "%s", h->why);
}

void kvc_hostmap_quiesce(kvc_t *c)
{
	(void)c;
}

void kvc_hostmap_close(kvc_t *c)
{
	free(atomic_load_explicit(&c->hostmap, memory_order_relaxed));
	atomic_store_explicit(&c->hostmap, NULL, memory_order_relaxed);
}

#endif
