// SPDX-License-Identifier: MIT
/*
 * pool_cuda.c - the GPU pool: device memory from the CUDA driver's virtual
 * memory management (VMM) API, shared with clients as file descriptors.
 *
 * Why VMM fds and not cudaIpcGetMemHandle (docs/ARCHITECTURE.md has the
 * long form): a legacy IPC handle is 64 bytes that any process on the host
 * holding them can open, with no kernel check of who it is; an fd can only
 * be had from us over the Unix socket, after SO_PEERCRED. VMM memory is
 * created in chunks at the allocation granularity (2 MiB on current GPUs)
 * rather than as one cudaMalloc, so the pool has any size, a large pool
 * does not need one contiguous physical range, and it could grow by more
 * chunks mapped behind the same reserved range.
 *
 * The daemon maps the chunks too (contiguously, like every client) for
 * what only it does with page contents: the spill tier's copies and
 * checksums. It never waits on a client: a client's mapping is its own,
 * and a killed client's mappings die with its process (the driver drops
 * its references), while the daemon goes on evicting and reusing pages.
 *
 * Built only with KVC_HAVE_CUDA; without it, opening a cuda pool fails
 * with "built without CUDA".
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../kernels/cudadrv.h"
#include "../util/log.h"
#include "pool.h"

#ifdef KVC_HAVE_CUDA
#include "../../kernels/page_cuda.h"

/* Pools up to this size are one chunk; larger ones are chunks of this
 * size, until KVPROTO_MAX_CHUNKS of them would not hold it. */
#define KVD_CHUNK_TARGET (1ull << 30)

struct kvd_pool_cuda {
	CUdevice dev;
	CUcontext ctx;
	CUdeviceptr va;
	uint64_t reserved;	/* n_chunks x chunk_bytes */
	uint64_t chunk_bytes;
	uint64_t gran;
	uint32_t n_chunks;
	uint32_t created, mapped;
	int ordinal;
	CUuuid uuid;
	CUmemGenericAllocationHandle h[KVPROTO_MAX_CHUNKS];
	int fds[KVPROTO_MAX_CHUNKS];
	struct kvk_module mod;
};

static uint64_t round_up(uint64_t v, uint64_t to)
{
	return (v + to - 1) / to * to;
}

/* A driver error as text, for one log line (one use per line). */
static const char *cu_log(CUresult r, const char *call)
{
	static __thread char e[200];

	return kvk_cu_err(r, call, e, sizeof(e));
}

static void ctx_pop(void)
{
	CUcontext old;

	kvk_cu.cuCtxPopCurrent(&old);
}

static void cuda_free(struct kvd_pool_cuda *g)
{
	uint32_t i;

	if (g->ctx)
		kvk_cu.cuCtxPushCurrent(g->ctx);
	if (g->mod.mod)
		kvk_module_unload(&g->mod);
	for (i = 0; i < g->mapped; i++)
		kvk_cu.cuMemUnmap(g->va + i * g->chunk_bytes, g->chunk_bytes);
	for (i = 0; i < g->created; i++) {
		kvk_cu.cuMemRelease(g->h[i]);
		if (g->fds[i] >= 0)
			close(g->fds[i]);
	}
	if (g->va)
		kvk_cu.cuMemAddressFree(g->va, g->reserved);
	if (g->ctx) {
		ctx_pop();
		kvk_cu.cuDevicePrimaryCtxRelease(g->dev);
	}
	free(g);
}

/* Create the pool's chunks on the GPU, export each as a file descriptor
 * and map it into g's address range. 0, or -ENOMEM or -EIO after a
 * message (what was made is undone by cuda_free). */
static int chunks_map(struct kvd_pool_cuda *g, const CUmemAllocationProp *prop, uint32_t gpu,
		      const char *name)
{
	CUresult r;
	uint32_t i;

	for (i = 0; i < g->n_chunks; i++) {
		r = kvk_cu.cuMemCreate(&g->h[i], g->chunk_bytes, prop, 0);
		if (r != CUDA_SUCCESS) {
			kvd_err("pool cuda: GPU %u (%s): cannot allocate chunk %u of %u (%llu bytes; %llu of %llu pool bytes allocated): %s",
				gpu, name, i + 1, g->n_chunks, (unsigned long long)g->chunk_bytes,
				(unsigned long long)(i * g->chunk_bytes), (unsigned long long)g->reserved,
				cu_log(r, "cuMemCreate"));
			return r == CUDA_ERROR_OUT_OF_MEMORY ? -ENOMEM : -EIO;
		}
		g->created++;
		r = kvk_cu.cuMemExportToShareableHandle(&g->fds[i], g->h[i],
							CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
		if (r != CUDA_SUCCESS) {
			g->fds[i] = -1;
			kvd_err("pool cuda: exporting chunk %u as a file descriptor: %s", i,
				cu_log(r, "cuMemExportToShareableHandle"));
			return -EIO;
		}
		r = kvk_cu.cuMemMap(g->va + i * g->chunk_bytes, g->chunk_bytes, 0, g->h[i], 0);
		if (r != CUDA_SUCCESS) {
			kvd_err("pool cuda: mapping chunk %u: %s", i, cu_log(r, "cuMemMap"));
			return -EIO;
		}
		g->mapped++;
	}
	return 0;
}

int kvd_pool_cuda_open(struct kvd_pool *p, uint64_t bytes, uint32_t gpu)
{
	struct kvd_pool_cuda *g;
	CUmemAllocationProp prop;
	CUmemAccessDesc acc;
	const char *why;
	char msg[300], name[128] = "?";
	uint64_t alloc, chunk;
	size_t gran;
	int count = 0, rc;
	CUresult r;
	uint32_t i;

	memset(p, 0, sizeof(*p));
	p->kind = KVSHM_POOL_CUDA;
	p->bytes = bytes;
	p->mem.fd = -1;
	if (kvk_cuda_load(&why)) {
		kvd_err("pool cuda: %s; use --pool host", why);
		return -ENOTSUP;
	}
	if ((r = kvk_cu.cuDeviceGetCount(&count)) != CUDA_SUCCESS || (int)gpu >= count) {
		kvd_err("pool cuda: gpu %u, but the CUDA driver sees %d GPU(s)%s", gpu, count,
			r != CUDA_SUCCESS ? cu_log(r, "cuDeviceGetCount") : "");
		return -ENODEV;
	}
	g = calloc(1, sizeof(*g));
	if (!g)
		return -ENOMEM;
	for (i = 0; i < KVPROTO_MAX_CHUNKS; i++)
		g->fds[i] = -1;
	g->ordinal = (int)gpu;
	rc = -EIO;
	if ((r = kvk_cu.cuDeviceGet(&g->dev, (int)gpu)) != CUDA_SUCCESS) {
		kvd_err("pool cuda: %s", cu_log(r, "cuDeviceGet"));
		goto out_free;
	}
	kvk_cu.cuDeviceGetName(name, sizeof(name), g->dev);
	if ((rc = kvk_cu_check_vmm(g->dev, (int)gpu, msg, sizeof(msg)))) {
		kvd_err("pool cuda: %s", msg);
		goto out_free;
	}
	rc = -EIO;
	if ((r = kvk_cu.cuDeviceGetUuid(&g->uuid, g->dev)) != CUDA_SUCCESS ||
	    (r = kvk_cu.cuDevicePrimaryCtxRetain(&g->ctx, g->dev)) != CUDA_SUCCESS) {
		kvd_err("pool cuda: GPU %u: %s", gpu, cu_log(r, "cuDeviceGetUuid or cuDevicePrimaryCtxRetain"));
		g->ctx = NULL;
		goto out_free;
	}
	kvk_cu.cuCtxPushCurrent(g->ctx);
	kvk_cu_vmm_prop(&prop, g->dev);
	r = kvk_cu.cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
	if (r != CUDA_SUCCESS || !gran) {
		kvd_err("pool cuda: GPU %u: %s", gpu, cu_log(r, "cuMemGetAllocationGranularity"));
		goto out_pop;
	}
	g->gran = gran;
	alloc = round_up(bytes, gran);
	/* As many chunks of about KVD_CHUNK_TARGET as it takes (at most
	 * KVPROTO_MAX_CHUNKS), each the same multiple of the granularity: the
	 * waste is under one granule per chunk, not up to a whole chunk. */
	{
		uint64_t n = (alloc + KVD_CHUNK_TARGET - 1) / KVD_CHUNK_TARGET;

		if (n > KVPROTO_MAX_CHUNKS)
			n = KVPROTO_MAX_CHUNKS;
		if (!n)
			n = 1;
		chunk = round_up((alloc + n - 1) / n, gran);
	}
	g->chunk_bytes = chunk;
	g->n_chunks = (uint32_t)((alloc + chunk - 1) / chunk);
	g->reserved = (uint64_t)g->n_chunks * chunk;
	if ((r = kvk_cu.cuMemAddressReserve(&g->va, g->reserved, gran, 0, 0)) != CUDA_SUCCESS) {
		kvd_err("pool cuda: reserving %llu bytes of address space: %s",
			(unsigned long long)g->reserved, cu_log(r, "cuMemAddressReserve"));
		g->va = 0;
		goto out_pop;
	}
	if ((rc = chunks_map(g, &prop, gpu, name)))
		goto out_pop;
	rc = -EIO;
	kvk_cu_rw_access(&acc, g->dev);
	if ((r = kvk_cu.cuMemSetAccess(g->va, g->reserved, &acc, 1)) != CUDA_SUCCESS ||
	    /* Fresh device memory may hold another process's old data. */
	    (r = kvk_cu.cuMemsetD8(g->va, 0, g->reserved)) != CUDA_SUCCESS ||
	    (r = kvk_cu.cuCtxSynchronize()) != CUDA_SUCCESS) {
		kvd_err("pool cuda: %s", cu_log(r, "cuMemSetAccess/cuMemsetD8"));
		goto out_pop;
	}
	if ((rc = kvk_module_load(&g->mod, &why))) {
		kvd_err("pool cuda: GPU %u (%s): %s", gpu, name, why);
		goto out_pop;
	}
	ctx_pop();
	p->cuda = g;
	kvd_info("pool: cuda, GPU %u (%s), %llu bytes in %u chunk(s) of %llu bytes (granularity %llu), shared as VMM file descriptors",
		 gpu, name, (unsigned long long)bytes, g->n_chunks,
		 (unsigned long long)chunk, (unsigned long long)gran);
	return 0;

out_pop:
	ctx_pop();
out_free:
	cuda_free(g);
	return rc;
}

int kvd_pool_cuda_share(const struct kvd_pool *p, struct kvproto_pool_r *r,
			const int **fds)
{
	const struct kvd_pool_cuda *g = p->cuda;

	if (p->kind != KVSHM_POOL_CUDA || !g)
		return -ENOTSUP;
	memset(r, 0, sizeof(*r));
	r->version = KVPROTO_VERSION;
	r->n_chunks = g->n_chunks;
	r->chunk_bytes = g->chunk_bytes;
	r->granularity = g->gran;
	r->pool_bytes = p->bytes;
	memcpy(r->uuid, g->uuid.bytes, sizeof(r->uuid));
	r->ordinal = g->ordinal;
	*fds = g->fds;
	return 0;
}

int kvd_pool_cuda_copy(struct kvd_pool *p, uint64_t off, uint64_t len, void *host, bool out)
{
	struct kvd_pool_cuda *g = p->cuda;
	CUresult r;

	if (kvk_cu.cuCtxPushCurrent(g->ctx) != CUDA_SUCCESS)
		return -EIO;
	r = out ? kvk_cu.cuMemcpyDtoH(host, g->va + off, len)
		: kvk_cu.cuMemcpyHtoD(g->va + off, host, len);
	/* From pageable memory (a staging ring that could not be locked) a
	 * host-to-device copy may return before it lands; the page becomes
	 * READY right after this, so wait until it has. */
	if (r == CUDA_SUCCESS && !out)
		r = kvk_cu.cuCtxSynchronize();
	ctx_pop();
	if (r != CUDA_SUCCESS) {
		kvd_err("pool cuda: %s", cu_log(r, out ? "cuMemcpyDtoH" : "cuMemcpyHtoD"));
		return -EIO;
	}
	return 0;
}

int kvd_pool_cuda_checksum(struct kvd_pool *p, const uint32_t *pages, uint32_t n,
			   uint64_t bytes, uint64_t *out)
{
	struct kvd_pool_cuda *g = p->cuda;
	CUdeviceptr *a;
	uint32_t i;
	int rc;

	if (!n)
		return 0;
	a = malloc(n * sizeof(*a));
	if (!a)
		return -ENOMEM;
	for (i = 0; i < n; i++)
		a[i] = g->va + (uint64_t)pages[i] * p->page_bytes;
	if (kvk_cu.cuCtxPushCurrent(g->ctx) != CUDA_SUCCESS) {
		free(a);
		return -EIO;
	}
	rc = kvk_csum_run(&g->mod, a, n, bytes, out, NULL);
	ctx_pop();
	free(a);
	return rc ? -EIO : 0;
}

int kvd_pool_cuda_pin(struct kvd_pool *p, void *buf, uint64_t len)
{
	CUresult r;

	if (kvk_cu.cuCtxPushCurrent(p->cuda->ctx) != CUDA_SUCCESS)
		return -EIO;
	r = kvk_cu.cuMemHostRegister(buf, len, CU_MEMHOSTREGISTER_PORTABLE);
	ctx_pop();
	if (r != CUDA_SUCCESS) {
		kvd_err("pool cuda: pinning %llu bytes of staging memory: %s (LimitMEMLOCK?)",
			(unsigned long long)len, cu_log(r, "cuMemHostRegister"));
		return r == CUDA_ERROR_OUT_OF_MEMORY ? -ENOMEM : -EIO;
	}
	return 0;
}

void kvd_pool_cuda_unpin(struct kvd_pool *p, void *buf)
{
	if (kvk_cu.cuCtxPushCurrent(p->cuda->ctx) != CUDA_SUCCESS)
		return;
	kvk_cu.cuMemHostUnregister(buf);
	ctx_pop();
}

void kvd_pool_cuda_close(struct kvd_pool *p)
{
	if (p->cuda)
		cuda_free(p->cuda);
	p->cuda = NULL;
}

#else

int kvd_pool_cuda_open(struct kvd_pool *p, uint64_t bytes, uint32_t gpu)
{
	const char *why = "built without CUDA";

	(void)gpu;
	memset(p, 0, sizeof(*p));
	p->kind = KVSHM_POOL_CUDA;
	p->bytes = bytes;
	p->mem.fd = -1;
	kvk_cuda_load(&why);	/* says how this kvcached was built */
	kvd_err("pool cuda: %s; use --pool host", why);
	return -ENOTSUP;
}

int kvd_pool_cuda_share(const struct kvd_pool *p, struct kvproto_pool_r *r,
			const int **fds)
{
	(void)p;
	(void)r;
	(void)fds;
	return -ENOTSUP;
}

/* Unreachable without a cuda pool; here so pool.c links. */
int kvd_pool_cuda_copy(struct kvd_pool *p, uint64_t off, uint64_t len, void *host, bool out)
{
	(void)p, (void)off, (void)len, (void)host, (void)out;
	return -ENOTSUP;
}

int kvd_pool_cuda_checksum(struct kvd_pool *p, const uint32_t *pages, uint32_t n,
			   uint64_t bytes, uint64_t *out)
{
	(void)p, (void)pages, (void)n, (void)bytes, (void)out;
	return -ENOTSUP;
}

int kvd_pool_cuda_pin(struct kvd_pool *p, void *buf, uint64_t len)
{
	(void)p, (void)buf, (void)len;
	return -ENOTSUP;
}

void kvd_pool_cuda_unpin(struct kvd_pool *p, void *buf)
{
	(void)p, (void)buf;
}

void kvd_pool_cuda_close(struct kvd_pool *p)
{
	p->cuda = NULL;
}

#endif
