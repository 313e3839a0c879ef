// SPDX-License-Identifier: MIT
/*
 * gpu.c - the page kernels for engines (kvc_gather, kvc_scatter) on either
 * pool, and the client side of a cuda pool: import the daemon's VMM chunk
 * fds once at attach and map them contiguously, so that a page's device
 * address is base + page x slot_bytes from then on, like a host pool's.
 *
 * A host pool runs the CPU reference (kernels/page_ref.c) on the calling
 * thread. A cuda pool launches kernels/page_copy.cu (embedded as a
 * fatbin) on the caller's stream in the primary context of the pool's
 * GPU, the one the CUDA runtime uses, so an engine's cudaStream_t works
 * as is. No libcudart and no link-time libcuda: see kernels/cudadrv.h.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_int.h"
#include "../kernels/cudadrv.h"
#include "../kernels/page_cuda.h"
#include "../kernels/page_ref.h"

static void say(char *buf, size_t len, const char *fmt, const char *a)
{
	if (buf && len)
		snprintf(buf, len, fmt, a);
}

#ifdef KVC_HAVE_CUDA

struct kvc_gpu {
	CUdevice dev;
	int ordinal;
	CUcontext ctx;		/* the device's primary context, retained */
	CUdeviceptr va;
	uint64_t reserved;
	uint32_t mapped;	/* chunks mapped */
	uint64_t chunk_bytes;
	struct kvk_module mod;
};

static void ctx_pop(void)
{
	CUcontext old;

	kvk_cu.cuCtxPopCurrent(&old);
}

static void gpu_free(struct kvc_gpu *g)
{
	uint32_t i;

	if (g->ctx) {
		kvk_cu.cuCtxPushCurrent(g->ctx);
		kvk_module_unload(&g->mod);
		for (i = 0; i < g->mapped; i++)
			kvk_cu.cuMemUnmap(g->va + i * g->chunk_bytes, g->chunk_bytes);
		if (g->va)
			kvk_cu.cuMemAddressFree(g->va, g->reserved);
		ctx_pop();
		kvk_cu.cuDevicePrimaryCtxRelease(g->dev);
	}
	free(g);
}

/* The device whose UUID the daemon sent: ordinals differ per process. */
static int find_device(const uint8_t uuid[16], CUdevice *dev, int *ordinal)
{
	int n = 0, i;

	if (kvk_cu.cuDeviceGetCount(&n) != CUDA_SUCCESS)
		return -ENODEV;
	for (i = 0; i < n; i++) {
		CUuuid u;
		CUdevice d;

		if (kvk_cu.cuDeviceGet(&d, i) == CUDA_SUCCESS &&
		    kvk_cu.cuDeviceGetUuid(&u, d) == CUDA_SUCCESS && !memcmp(u.bytes, uuid, 16)) {
			*dev = d;
			*ordinal = i;
			return 0;
		}
	}
	return -ENODEV;
}

int kvc_gpu_attach(kvc_t *c, const struct kvproto_pool_r *pr, const int *fds,
		   char *errbuf, size_t errlen)
{
	struct kvc_gpu *g;
	CUmemAccessDesc acc;
	const char *why;
	char msg[300];
	CUresult r;
	uint32_t i;
	int rc;

	if (kvk_cuda_load(&why)) {
		say(errbuf, errlen, "kvcached's pool is on a GPU, but %s", why);
		return -ENOTSUP;
	}
	g = calloc(1, sizeof(*g));
	if (!g)
		return -ENOMEM;
	g->chunk_bytes = pr->chunk_bytes;
	g->reserved = pr->chunk_bytes * pr->n_chunks;
	if (find_device(pr->uuid, &g->dev, &g->ordinal)) {
		snprintf(msg, sizeof(msg), "kvcached's pool is on its GPU %d, which this process cannot see (CUDA_VISIBLE_DEVICES?)",
			 pr->ordinal);
		say(errbuf, errlen, "%s", msg);
		rc = -ENODEV;
		goto out_free;
	}
	if ((rc = kvk_cu_check_vmm(g->dev, g->ordinal, msg, sizeof(msg)))) {
		say(errbuf, errlen, "%s", msg);
		goto out_free;
	}
	rc = -EIO;
	if ((r = kvk_cu.cuDevicePrimaryCtxRetain(&g->ctx, g->dev)) != CUDA_SUCCESS) {
		g->ctx = NULL;
		say(errbuf, errlen, "%s", kvk_cu_err(r, "cuDevicePrimaryCtxRetain", msg, sizeof(msg)));
		goto out_free;
	}
	kvk_cu.cuCtxPushCurrent(g->ctx);
	r = kvk_cu.cuMemAddressReserve(&g->va, g->reserved, pr->granularity, 0, 0);
	if (r != CUDA_SUCCESS) {
		g->va = 0;
		say(errbuf, errlen, "%s", kvk_cu_err(r, "cuMemAddressReserve", msg, sizeof(msg)));
		goto out_pop;
	}
	for (i = 0; i < pr->n_chunks; i++) {
		CUmemGenericAllocationHandle h;

		r = kvk_cu.cuMemImportFromShareableHandle(&h, (void *)(uintptr_t)fds[i],
							  CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
		if (r != CUDA_SUCCESS) {
			say(errbuf, errlen, "%s", kvk_cu_err(r, "cuMemImportFromShareableHandle", msg, sizeof(msg)));
			goto out_pop;
		}
		r = kvk_cu.cuMemMap(g->va + i * g->chunk_bytes, g->chunk_bytes, 0, h, 0);
		/* The mapping holds the memory now; the handle can go. */
		kvk_cu.cuMemRelease(h);
		if (r != CUDA_SUCCESS) {
			say(errbuf, errlen, "%s", kvk_cu_err(r, "cuMemMap", msg, sizeof(msg)));
			goto out_pop;
		}
		g->mapped++;
	}
	kvk_cu_rw_access(&acc, g->dev);
	r = kvk_cu.cuMemSetAccess(g->va, g->reserved, &acc, 1);
	if (r != CUDA_SUCCESS) {
		say(errbuf, errlen, "%s", kvk_cu_err(r, "cuMemSetAccess", msg, sizeof(msg)));
		goto out_pop;
	}
	if ((rc = kvk_module_load(&g->mod, &why))) {
		say(errbuf, errlen, "%s", why);
		goto out_pop;
	}
	ctx_pop();
	c->gpu = g;
	c->pool = (uint8_t *)(uintptr_t)g->va;
	c->pool_bytes = pr->pool_bytes;
	return 0;

out_pop:
	ctx_pop();
out_free:
	gpu_free(g);
	return rc;
}

void kvc_gpu_quiesce(kvc_t *c)
{
	struct kvc_gpu *g = c->gpu;

	/* Kernels still queued on the pool's pages must finish before the
	 * daemon hands those pages to someone else. */
	if (!g || kvk_cu.cuCtxPushCurrent(g->ctx) != CUDA_SUCCESS)
		return;
	kvk_cu.cuCtxSynchronize();
	ctx_pop();
}

void kvc_gpu_detach(kvc_t *c)
{
	struct kvc_gpu *g = c->gpu;

	c->gpu = NULL;
	c->pool = NULL;
	if (!g)
		return;
	/* A child of fork() cannot use its parent's CUDA state at all. */
	if (c->fork_gen != atomic_load_explicit(&kvc_fork_gen, memory_order_relaxed)) {
		free(g);
		return;
	}
	gpu_free(g);
}

/*
 * Can a kernel on GPU `ordinal` touch [p, p + span)? Both ends must be
 * memory CUDA knows: device memory of that GPU, managed memory, or mapped
 * pinned host memory. 0, -EFAULT (unknown: a plain host pointer) or
 * -EXDEV (another GPU's memory: the kernel runs on the pool's GPU).
 */
static int reachable(const void *p, uint64_t span, int ordinal)
{
	CUdeviceptr a = (CUdeviceptr)(uintptr_t)p, ends[2] = { a, a + span - 1 };
	int k;

	for (k = 0; k < 2; k++) {
		unsigned int type = 0, flag = 0;
		int dev = -1;

		if (kvk_cu.cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, ends[k]) != CUDA_SUCCESS) {
			/* VMM memory (cuMemCreate: PyTorch's expandable
			 * segments) may answer only "mapped". */
			if (kvk_cu.cuPointerGetAttribute(&flag, CU_POINTER_ATTRIBUTE_MAPPED, ends[k]) == CUDA_SUCCESS &&
			    flag)
				continue;
			return -EFAULT;
		}
		if (type != CU_MEMORYTYPE_DEVICE)
			continue;
		if (kvk_cu.cuPointerGetAttribute(&flag, CU_POINTER_ATTRIBUTE_IS_MANAGED, ends[k]) == CUDA_SUCCESS &&
		    flag)
			continue;
		/* Refuse only what is known to be elsewhere. */
		if (kvk_cu.cuPointerGetAttribute(&dev, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ends[k]) == CUDA_SUCCESS &&
		    dev != ordinal)
			return -EXDEV;
	}
	return 0;
}

/*
 * A kernel that touches a plain host pointer (the usual mistake: the
 * engine's host copy, or a layout meant for a host pool) or another GPU's
 * memory does not fail alone: it poisons the whole context with an
 * illegal-address error. So every tensor is checked first, both ends of
 * the span the run may touch. That costs a few driver lookups per tensor
 * (microseconds for a whole model), against milliseconds of prefill.
 */
static int check_tensors(const struct kvk_layout *l, int ordinal)
{
	uint64_t span = (l->num_blocks - 1) * l->block_stride + l->half;
	uint32_t i;
	int rc;

	if (l->kind == KVK_LAYOUT_FLASH)
		span += l->num_blocks * l->block_stride;
	for (i = 0; i < l->layers; i++) {
		if ((rc = reachable(l->k[i], span, ordinal)))
			return rc;
		if (l->kind == KVK_LAYOUT_KV && (rc = reachable(l->v[i], span, ordinal)))
			return rc;
	}
	return 0;
}

static int gpu_copy(kvc_t *c, enum kvk_dir dir, const struct kvk_layout *l,
		    const uint32_t *pages, const int64_t *ids, size_t n, void *stream)
{
	struct kvc_gpu *g = c->gpu;
	int rc;

	if (!g)
		return -ENOTSUP;
	/* A failed push must not be followed by a pop: that would take the
	 * engine thread's own context off its stack. */
	if (kvk_cu.cuCtxPushCurrent(g->ctx) != CUDA_SUCCESS)
		return -EIO;
	rc = check_tensors(l, g->ordinal);
	if (!rc)
		rc = kvk_copy_launch(&g->mod, dir, l, g->va, c->slot_bytes, pages, ids, n,
				     (CUstream)stream);
	ctx_pop();
	return rc == -EINVAL || rc == -EBADF ? -EIO : rc;
}

int kvc_pool_device(const kvc_t *c)
{
	if (!c)
		return -EINVAL;
	return c->gpu ? c->gpu->ordinal : -ENODEV;
}

#else

struct kvc_gpu;

int kvc_gpu_attach(kvc_t *c, const struct kvproto_pool_r *pr, const int *fds,
		   char *errbuf, size_t errlen)
{
	(void)c, (void)pr, (void)fds;
	say(errbuf, errlen, "%s",
	    "kvcached's pool is on a GPU, but this libkvclient was built without CUDA (no nvcc at build time, or NO_CUDA=1)");
	return -ENOTSUP;
}

void kvc_gpu_quiesce(kvc_t *c)
{
	(void)c;
}

void kvc_gpu_detach(kvc_t *c)
{
	c->gpu = NULL;
	c->pool = NULL;
}

static int gpu_copy(kvc_t *c, enum kvk_dir dir, const struct kvk_layout *l,
		    const uint32_t *pages, const int64_t *ids, size_t n, void *stream)
{
	(void)c, (void)dir, (void)l, (void)pages, (void)ids, (void)n, (void)stream;
	return -ENOTSUP;
}

int kvc_pool_device(const kvc_t *c)
{
	return c ? -ENODEV : -EINVAL;
}

#endif

int kvc_pool_kind(const kvc_t *c)
{
	if (!c)
		return -EINVAL;
	return c->pool_kind == KVSHM_POOL_CUDA ? KVC_POOL_CUDA : KVC_POOL_HOST;
}

static bool zero(const uint64_t *r, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++)
		if (r[i])
			return false;
	return true;
}

/*
 * Where this rank's heads sit in a page (page_ref.h): all of them, one
 * run per segment; or its heads of each token row, block_tokens runs.
 */
static void page_layout(const kvc_t *c, struct kvk_layout *kl)
{
	memset(kl, 0, sizeof(*kl));
	kl->page_half = c->half;
	kl->page_row = (uint64_t)c->kv_heads * c->head_bytes;
	kl->row = (uint64_t)c->part.heads * c->head_bytes;
	kl->page_off = (uint64_t)c->part.head0 * c->head_bytes;
	kl->rows = c->bt;
	if (c->part.heads == c->kv_heads) {	/* every head: one run */
		kl->row = kl->page_row = c->half;
		kl->rows = 1;
	}
	kl->half = kl->rows * kl->row;
}

static int page_copy(struct kvc_req *r, size_t first, size_t n, const struct kvc_layout *l,
		     const int64_t *ids, void *stream, enum kvk_dir dir)
{
	struct kvk_layout kl;
	kvc_t *c;
	size_t j;
	int rc;

	if (!r)
		return -EINVAL;
	c = r->c;
	if (c->fork_gen != atomic_load_explicit(&kvc_fork_gen, memory_order_relaxed))
		return -ECHILD;
	if (!l || l->size != sizeof(*l) || l->flags || !zero(l->resv, 4) ||
	    l->layers != c->layers || (n && !ids) ||
	    (l->kind == KVC_LAYOUT_MLA) != c->latent)
		return -EINVAL;
	if (dir == KVK_SCATTER && n && !c->part.writes)
		return -EPERM;	/* another rank of its engine writes these heads */
	page_layout(c, &kl);
	kl.kind = l->kind;	/* the kvc_ and kvk_ kinds share their values */
	kl.layers = l->layers;
	kl.num_blocks = l->num_blocks;
	kl.block_stride = l->block_stride ? l->block_stride : kl.half;
	kl.k = l->k;
	kl.v = l->kind == KVC_LAYOUT_KV ? l->v : NULL;
	if (kvk_layout_check(&kl, NULL))
		return -EINVAL;
	if (first > r->n || n > r->n - first)
		return -EINVAL;
	for (j = 0; j < n; j++) {
		uint8_t st = r->state[first + j];

		if (ids[j] < 0 || (uint64_t)ids[j] >= l->num_blocks)
			return -EINVAL;
		if (st == KVC_B_NONE)
			return -ENOENT;
		if (dir == KVK_SCATTER && st != KVC_B_WRITING)
			return -EPERM;
	}
	if (!n)
		return 0;
	if (c->pool_kind == KVSHM_POOL_CUDA)
		return gpu_copy(c, dir, &kl, r->page + first, ids, n, stream);
	kvk_ref_copy(dir, &kl, c->pool, c->slot_bytes, r->page + first, ids, n);
	rc = 0;
	return rc;
}

_Static_assert(KVC_LAYOUT_KV == (int)KVK_LAYOUT_KV && KVC_LAYOUT_FLASH == (int)KVK_LAYOUT_FLASH &&
	       KVC_LAYOUT_MLA == (int)KVK_LAYOUT_MLA, "layout kinds");

int kvc_gather(struct kvc_req *r, size_t first_block, size_t n_blocks,
	       const struct kvc_layout *l, const int64_t *engine_block_ids, void *stream)
{
	return page_copy(r, first_block, n_blocks, l, engine_block_ids, stream, KVK_GATHER);
}

int kvc_scatter(struct kvc_req *r, size_t first_block, size_t n_blocks,
		const struct kvc_layout *l, const int64_t *engine_block_ids, void *stream)
{
	return page_copy(r, first_block, n_blocks, l, engine_block_ids, stream, KVK_SCATTER);
}
