// SPDX-License-Identifier: MIT
/*
 * pool.c - what every pool backend offers the rest of the daemon: open by
 * the configured kind, and the page copies and checksums the spill tier
 * needs, dispatched to the host pool (memcpy, the CPU checksum) or the
 * cuda pool (pool_cuda.c).
 */
#include <errno.h>
#include <string.h>

#include "../../kernels/page_ref.h"
#include "../util/log.h"
#include "pool.h"

/* pool_cuda.c */
int kvd_pool_cuda_copy(struct kvd_pool *p, uint64_t off, uint64_t len, void *host, bool out);
int kvd_pool_cuda_checksum(struct kvd_pool *p, const uint32_t *pages, uint32_t n,
			   uint64_t bytes, uint64_t *out);
int kvd_pool_cuda_pin(struct kvd_pool *p, void *buf, uint64_t len);
void kvd_pool_cuda_unpin(struct kvd_pool *p, void *buf);

int kvd_pool_open(struct kvd_pool *p, const struct kvd_config *cfg, uint64_t bytes,
		  uint64_t page_bytes)
{
	int rc;

	if (!strcmp(cfg->pool, "cuda"))
		rc = kvd_pool_cuda_open(p, bytes, cfg->gpu);
	else
		rc = kvd_pool_host_open(p, bytes, cfg->hugepages);
	if (!rc)
		p->page_bytes = page_bytes;
	return rc;
}

static int range(const struct kvd_pool *p, uint32_t page, uint32_t n, uint64_t *off,
		 uint64_t *len)
{
	if (!n || !p->page_bytes || (uint64_t)page + n > p->bytes / p->page_bytes)
		return -EINVAL;
	*off = (uint64_t)page * p->page_bytes;
	*len = (uint64_t)n * p->page_bytes;
	return 0;
}

int kvd_pool_copy_out(struct kvd_pool *p, uint32_t page, uint32_t n, void *dst)
{
	uint64_t off, len;

	if (!dst || range(p, page, n, &off, &len))
		return -EINVAL;
	if (p->kind == KVSHM_POOL_CUDA)
		return kvd_pool_cuda_copy(p, off, len, dst, true);
	memcpy(dst, (const char *)p->mem.base + off, len);
	return 0;
}

int kvd_pool_copy_in(struct kvd_pool *p, uint32_t page, uint32_t n, const void *src)
{
	uint64_t off, len;

	if (!src || range(p, page, n, &off, &len))
		return -EINVAL;
	if (p->kind == KVSHM_POOL_CUDA)
		return kvd_pool_cuda_copy(p, off, len, (void *)src, false);
	memcpy((char *)p->mem.base + off, src, len);
	return 0;
}

int kvd_pool_checksum(struct kvd_pool *p, const uint32_t *pages, uint32_t n,
		      uint64_t bytes, uint64_t *out)
{
	uint64_t off, len;
	uint32_t i;

	if (!pages || !out || bytes > p->page_bytes)
		return -EINVAL;
	for (i = 0; i < n; i++)
		if (range(p, pages[i], 1, &off, &len))
			return -EINVAL;
	if (p->kind == KVSHM_POOL_CUDA)
		return kvd_pool_cuda_checksum(p, pages, n, bytes, out);
	for (i = 0; i < n; i++)
		out[i] = kvk_ref_checksum((const char *)p->mem.base +
					  (uint64_t)pages[i] * p->page_bytes, bytes);
	return 0;
}

int kvd_pool_pin_host(struct kvd_pool *p, void *buf, uint64_t len)
{
	if (!buf || !len)
		return -EINVAL;
	return p->kind == KVSHM_POOL_CUDA ? kvd_pool_cuda_pin(p, buf, len) : 0;
}

void kvd_pool_unpin_host(struct kvd_pool *p, void *buf)
{
	if (p->kind == KVSHM_POOL_CUDA && buf)
		kvd_pool_cuda_unpin(p, buf);
}
