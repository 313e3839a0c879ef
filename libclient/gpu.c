// SPDX-License-Identifier: MIT
/*
 * gpu.c - the page kernels for engines (kvc_gather, kvc_scatter and their
 * _v2 forms with a layer range and events) on either pool, and the client
 * side of a cuda pool: import the daemon's VMM chunk fds once at attach
 * and map them contiguously, so that a page's device address is base +
 * page x slot_bytes from then on, like a host pool's.
 *
 * Three ways a copy runs:
 *  - host pool, host tensors: the CPU reference (kernels/page_ref.c) on
 *    the calling thread;
 *  - cuda pool: kernels/page_copy.cu (embedded as a fatbin) on the
 *    caller's stream in the primary context of the pool's GPU, the one
 *    the CUDA runtime uses, so an engine's cudaStream_t works as is;
 *  - host pool, tensors on a GPU (KVC_LAYOUT_DEVICE): the same kernels in
 *    that GPU's primary context, reading and writing the pool's pages
 *    over the bus where hostmap.c has registered them with CUDA, and
 *    driver copies per piece for pages it has not registered yet.
 * One launch per call for every layer asked, or one per layer when the
 * caller wants an event per layer. No libcudart and no link-time libcuda:
 * see kernels/cudadrv.h.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_int.h"
#include "hostmap.h"
#include "../kernels/cudadrv.h"
#include "../kernels/page_cuda.h"
#include "../kernels/page_ref.h"

static void say(char *buf, size_t len, const char *fmt, const char *a)
{
	if (buf && len)
		snprintf(buf, len, fmt, a);
}

/* Layers first .. first + n - 1 of l, and the pool offset of the first
 * one's K in a page: a copy of them is a copy of a smaller model. */
static struct kvk_layout layers_of(const struct kvk_layout *l, uint32_t first, uint32_t n,
				   uint64_t *pool_off)
{
	struct kvk_layout s = *l;

	s.k = l->k + first;
	s.v = l->v ? l->v + first : NULL;
	s.layers = n;
	*pool_off = (uint64_t)kvk_halves(l) * first * l->page_half;
	return s;
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
	struct kvk_check_cache cache;
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
	kvk_check_cache_free(&g->cache);
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
	pthread_mutex_init(&g->cache.lock, NULL);
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

/* Where one GPU copy runs. */
struct target {
	CUcontext ctx;
	const struct kvk_module *mod;
	struct kvk_check_cache *cache;
	int ordinal;
	CUdeviceptr pool;	/* the pool as kernels address it */
	bool host;		/* a host pool: pages may need pieces */
};

static int record(void *event, CUstream s)
{
	return event && kvk_cu.cuEventRecord((CUevent)event, s) != CUDA_SUCCESS ? -EIO : 0;
}

/*
 * A host pool's pages split by whether kernels can address them: *rp and
 * *ri the registered ones and their engine blocks, *up and *ui the others.
 * The arrays are one allocation, at *ri, for the caller to free.
 */
static int split(kvc_t *c, const uint32_t *pages, const int64_t *ids, size_t n,
		 uint32_t **rp, int64_t **ri, size_t *rn, uint32_t **up, int64_t **ui,
		 size_t *un)
{
	int64_t *iv = malloc(n * (2 * sizeof(int64_t) + 2 * sizeof(uint32_t)));
	uint32_t *pv;
	size_t j;

	if (!iv)
		return -ENOMEM;
	*ri = iv;
	*ui = iv + n;
	pv = (uint32_t *)(iv + 2 * n);
	*rp = pv;
	*up = pv + n;
	*rn = *un = 0;
	for (j = 0; j < n; j++) {
		if (kvc_hostmap_registered(c, (uint64_t)pages[j] * c->slot_bytes, c->slot_bytes)) {
			(*rp)[*rn] = pages[j];
			(*ri)[(*rn)++] = ids[j];
		} else {
			(*up)[*un] = pages[j];
			(*ui)[(*un)++] = ids[j];
		}
	}
	return 0;
}

/* Layers first .. first + count - 1: the kernel for the pages it can
 * address (their arguments uploaded once in a), pieces for the others. */
static int copy_layers(kvc_t *c, const struct target *t, enum kvk_dir dir,
		       const struct kvk_layout *l, const struct kvk_args *a, size_t rn,
		       const uint32_t *up, const int64_t *ui, size_t un, uint32_t first,
		       uint32_t count, CUstream s)
{
	struct kvk_layout sl;
	uint64_t off;
	int rc = 0;

	if (rn)
		rc = kvk_copy_run(t->mod, dir, l, t->pool, a, first, count, rn, s);
	if (!rc && un) {
		sl = layers_of(l, first, count, &off);
		rc = kvk_copy_pieces(dir, &sl, c->pool + off, c->slot_bytes, up, ui, un, s);
	}
	return rc;
}

/*
 * One upload of the arguments, then one launch for the layers asked, or
 * one per layer each followed by its event; the event after all.
 */
static int gpu_copy(kvc_t *c, const struct target *t, enum kvk_dir dir,
		    const struct kvk_layout *l, const uint32_t *pages, const int64_t *ids,
		    size_t n, uint32_t first, uint32_t nl, const struct kvc_copy_opts *o)
{
	CUstream s = (CUstream)o->stream;
	const uint32_t *rp = pages, *up = NULL;
	const int64_t *ri = ids, *ui = NULL;
	uint32_t *rpv = NULL, *upv = NULL;
	int64_t *riv = NULL, *uiv = NULL;
	struct kvk_args a = { 0 };
	size_t rn = n, un = 0;
	uint32_t i;
	int rc, rc2;

	/* A failed push must not be followed by a pop: that would take the
	 * engine thread's own context off its stack. */
	if (kvk_cu.cuCtxPushCurrent(t->ctx) != CUDA_SUCCESS)
		return -EIO;
	rc = kvk_tensors_check_cached(t->cache, l, t->ordinal);
	if (!rc && t->host) {
		rc = split(c, pages, ids, n, &rpv, &riv, &rn, &upv, &uiv, &un);
		rp = rpv, ri = riv, up = upv, ui = uiv;
	}
	if (!rc && rn)
		rc = kvk_args_upload(t->mod, l, c->slot_bytes, rp, ri, rn, s, &a);
	if (!rc && o->layer_events) {
		for (i = 0; i < nl && !rc; i++) {
			rc = copy_layers(c, t, dir, l, &a, rn, up, ui, un, first + i, 1, s);
			if (!rc)
				rc = record(o->layer_events[i], s);
		}
	} else if (!rc) {
		rc = copy_layers(c, t, dir, l, &a, rn, up, ui, un, first, nl, s);
	}
	rc2 = kvk_args_free(&a, s);
	if (!rc)
		rc = rc2 ? rc2 : record(o->event, s);
	ctx_pop();
	free(riv);
	return rc == -EINVAL || rc == -EBADF ? -EIO : rc;
}

/* The GPU a copy of l runs on: 0 with *t set, or -errno. */
static int target_of(kvc_t *c, const struct kvc_layout *l, struct target *t)
{
	struct kvc_gpu *g = c->gpu;
	struct kvc_hostdev *d;
	int rc;

	if (c->pool_kind == KVSHM_POOL_CUDA) {
		if (!g)
			return -ENOTSUP;
		if ((l->flags & KVC_LAYOUT_DEVICE) && l->device != g->ordinal)
			return -EXDEV;
		*t = (struct target){ g->ctx, &g->mod, &g->cache, g->ordinal, g->va, false };
		return 0;
	}
	d = kvc_hostmap_dev(c, l->device, &rc);
	if (!d)
		return rc;
	*t = (struct target){ d->ctx, &d->mod, &d->cache, d->ordinal,
			      (CUdeviceptr)(uintptr_t)c->pool, true };
	return 0;
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

struct target {
	int unused;
};

static int target_of(kvc_t *c, const struct kvc_layout *l, struct target *t)
{
	(void)l, (void)t;
	/* Says why, once, for kvc_gpu_status. */
	if (c->pool_kind != KVSHM_POOL_CUDA)
		kvc_hostmap_prepare(c, 0, 0);
	return -ENOTSUP;
}

static int gpu_copy(kvc_t *c, const struct target *t, enum kvk_dir dir,
		    const struct kvk_layout *l, const uint32_t *pages, const int64_t *ids,
		    size_t n, uint32_t first, uint32_t nl, const struct kvc_copy_opts *o)
{
	(void)c, (void)t, (void)dir, (void)l, (void)pages, (void)ids, (void)n, (void)first;
	(void)nl, (void)o;
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
		     const int64_t *ids, const struct kvc_copy_opts *o, enum kvk_dir dir)
{
	static const struct kvc_copy_opts none = { sizeof(struct kvc_copy_opts) };
	struct kvk_layout kl, sl;
	struct target t = { 0 };
	uint32_t l0, nl;
	uint64_t off;
	kvc_t *c;
	size_t j;
	int rc;

	if (!r)
		return -EINVAL;
	c = r->c;
	if (c->fork_gen != atomic_load_explicit(&kvc_fork_gen, memory_order_relaxed))
		return -ECHILD;
	if (!o)
		o = &none;
	if (!l || l->size != sizeof(*l) || (l->flags & ~(uint32_t)KVC_LAYOUT_DEVICE) ||
	    l->resv32 || !zero(l->resv, 3) || l->layers != c->layers || (n && !ids) ||
	    (l->flags & KVC_LAYOUT_DEVICE ? l->device < 0 : l->device != 0) ||
	    (l->kind == KVC_LAYOUT_MLA) != c->latent)
		return -EINVAL;
	if (o->size != sizeof(*o) || o->flags || !zero(o->resv, 4) || o->first_layer >= c->layers ||
	    o->layers > c->layers - o->first_layer)
		return -EINVAL;
	if (dir == KVK_SCATTER && n && !c->part.writes)
		return -EPERM;	/* another rank of its engine writes these heads */
	l0 = o->first_layer;
	nl = o->layers ? o->layers : c->layers - l0;
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
	if (c->pool_kind == KVSHM_POOL_CUDA || (l->flags & KVC_LAYOUT_DEVICE)) {
		if ((rc = target_of(c, l, &t)))
			return rc;
		return gpu_copy(c, &t, dir, &kl, r->page + first, ids, n, l0, nl, o);
	}
	sl = layers_of(&kl, l0, nl, &off);
	kvk_ref_copy(dir, &sl, c->pool + off, c->slot_bytes, r->page + first, ids, n);
	return 0;
}

_Static_assert(KVC_LAYOUT_KV == (int)KVK_LAYOUT_KV && KVC_LAYOUT_FLASH == (int)KVK_LAYOUT_FLASH &&
	       KVC_LAYOUT_MLA == (int)KVK_LAYOUT_MLA, "layout kinds");

int kvc_gather(struct kvc_req *r, size_t first_block, size_t n_blocks,
	       const struct kvc_layout *l, const int64_t *engine_block_ids, void *stream)
{
	struct kvc_copy_opts o = { .size = sizeof(o), .stream = stream };

	return page_copy(r, first_block, n_blocks, l, engine_block_ids, &o, KVK_GATHER);
}

int kvc_scatter(struct kvc_req *r, size_t first_block, size_t n_blocks,
		const struct kvc_layout *l, const int64_t *engine_block_ids, void *stream)
{
	struct kvc_copy_opts o = { .size = sizeof(o), .stream = stream };

	return page_copy(r, first_block, n_blocks, l, engine_block_ids, &o, KVK_SCATTER);
}

int kvc_gather_v2(struct kvc_req *r, size_t first_block, size_t n_blocks,
		  const struct kvc_layout *l, const int64_t *engine_block_ids,
		  const struct kvc_copy_opts *o)
{
	return page_copy(r, first_block, n_blocks, l, engine_block_ids, o, KVK_GATHER);
}

int kvc_scatter_v2(struct kvc_req *r, size_t first_block, size_t n_blocks,
		   const struct kvc_layout *l, const int64_t *engine_block_ids,
		   const struct kvc_copy_opts *o)
{
	return page_copy(r, first_block, n_blocks, l, engine_block_ids, o, KVK_SCATTER);
}

int kvc_gpu_prepare(kvc_t *c, int device, uint32_t flags)
{
	if (!c || device < 0 || (flags & ~(uint32_t)KVC_GPU_WAIT))
		return -EINVAL;
	if (c->fork_gen != atomic_load_explicit(&kvc_fork_gen, memory_order_relaxed))
		return -ECHILD;
	if (c->pool_kind == KVSHM_POOL_CUDA)	/* prepared at attach */
		return c->gpu ? (device == kvc_pool_device(c) ? 0 : -EXDEV) : -ENOTSUP;
	return kvc_hostmap_prepare(c, device, flags);
}

int kvc_gpu_status(const kvc_t *c, struct kvc_gpu_status *st)
{
	if (!c || !st || st->size != sizeof(*st))
		return -EINVAL;
	memset(st, 0, sizeof(*st));
	st->size = sizeof(*st);
	st->device = -1;
	if (c->pool_kind == KVSHM_POOL_CUDA) {
		if (c->gpu) {
			st->state = KVC_GPU_READY;
			st->device = kvc_pool_device(c);
		}
		return 0;
	}
	kvc_hostmap_status(c, st);
	return 0;
}
