// SPDX-License-Identifier: MIT
/*
 * gpu.c - kvbench's gpu mode: the page kernels (kvc_gather / kvc_scatter on
 * a cuda pool) in GB/s against cuMemcpyDtoD of the same bytes on the same
 * GPU, in the same run (gpucopy_run, shared with kvbench-gpu). Llama-3-8B
 * pages (2 MiB, 32 KiB pieces), 256 blocks (--quick: 64), layout kv.
 *
 * Where the build has no CUDA, or the machine no driver or GPU, both rows
 * are "skipped: <why>" with no figures; that is not a failure. A CUDA
 * error on a GPU that is there is one.
 */
#include <stdio.h>
#include <string.h>

#include "bench.h"
#include "gpucopy.h"

void mode_gpu(void)
{
	static char why[512];
	struct gpucopy_cfg c = GPUCOPY_DEFAULTS;
	struct gpucopy_res r;
	struct row row = { .mode = "gpu", .procs = 1, .unit = "GB/s",
			   .peer_kind = "cuMemcpyDtoD" };
	int rc;

	if (opt.quick) {
		c.blocks = 64;
		c.iters = 5;
	}
	rc = gpucopy_run(&c, &r, why, sizeof(why));
	if (rc < 0)
		die("gpu: %s", why);
	row.blocks = c.blocks;
	row.page_bytes = (size_t)c.bt * c.heads * c.dim * c.dtype * 2 * c.layers;
	if (rc > 0) {
		/* The table's column is narrow: the loader's text shortened. */
		if (!strncmp(why, "no CUDA driver: ", 16) && strstr(why, "cannot open shared object"))
			snprintf(why, sizeof(why), "no CUDA driver (libcuda.so.1 not found)");
		else if (!strncmp(why, "built without CUDA", 18))
			snprintf(why, sizeof(why), "built without CUDA");
		row.skipped = why;
		row.op = "gather";
		add_row(&row);
		row.op = "scatter";
		add_row(&row);
		return;
	}
	row.op = "gather";
	row.kv = r.bytes / r.gather_s / 1e9;
	row.peer = r.bytes / r.dtod_s / 1e9;
	add_row(&row);
	row.op = "scatter";
	row.kv = r.bytes / r.scatter_s / 1e9;
	add_row(&row);
}
