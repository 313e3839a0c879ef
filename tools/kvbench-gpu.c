// SPDX-License-Identifier: MIT
/*
 * kvbench-gpu.c - the page kernels' bandwidth next to the GPU's own copy
 * engine path, measured in the same run on the same GPU and printed as a
 * ratio (kvbench's rule: every figure next to its peer).
 *
 * What is timed: see tools/bench/gpucopy.h (gpucopy_run, shared with
 * kvbench's gpu mode): the gather and scatter kernels over --blocks random
 * pool pages and engine blocks in one launch, and cuMemcpyDtoD of the same
 * number of bytes in one contiguous range, over --iters passes.
 *
 * GB/s are 1e9 bytes of KV copied (each byte read once and written once).
 * The target is gather >= 80% of dtod. Geometry defaults to Llama-3-8B
 * (32 layers, 8 kv heads, head dim 128, bf16, 16-token blocks: 2 MiB
 * pages, 32 KiB pieces). Exits 77, saying why, where there is no GPU.
 *
 *   kvbench-gpu [--gpu N] [--blocks N] [--iters N] [--layers N]
 *               [--kv-heads N] [--head-dim N] [--dtype N] [--block-tokens N]
 *               [--layout kv|flash]
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../libclient/kvclient.h"
#include "bench/gpucopy.h"

static void usage(FILE *f)
{
	fprintf(f, "usage: kvbench-gpu [--gpu N] [--blocks N] [--iters N] [--layers N] [--kv-heads N]\n"
		   "                   [--head-dim N] [--dtype N] [--block-tokens N] [--layout kv|flash]\n"
		   "       kvbench-gpu --help | --version\n");
}

int main(int argc, char **argv)
{
	struct gpucopy_cfg c = GPUCOPY_DEFAULTS;
	struct gpucopy_res r;
	const char *layout = "kv";
	char why[512];
	int i, rc;

	for (i = 1; i < argc; i++) {
		unsigned long *v = NULL;
		char *end;

		if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
			usage(stdout);
			return 0;
		}
		if (!strcmp(argv[i], "--version")) {
			printf("kvbench-gpu %s\n", KVC_VERSION_STRING);
			return 0;
		}
		if (!strcmp(argv[i], "--layout") && i + 1 < argc) {
			layout = argv[++i];
			if (strcmp(layout, "kv") && strcmp(layout, "flash")) {
				fprintf(stderr, "kvbench-gpu: --layout %s: must be kv or flash\n", layout);
				return 2;
			}
			c.flash = !strcmp(layout, "flash");
			continue;
		}
		if (!strcmp(argv[i], "--gpu")) v = &c.gpu;
		else if (!strcmp(argv[i], "--blocks")) v = &c.blocks;
		else if (!strcmp(argv[i], "--iters")) v = &c.iters;
		else if (!strcmp(argv[i], "--layers")) v = &c.layers;
		else if (!strcmp(argv[i], "--kv-heads")) v = &c.heads;
		else if (!strcmp(argv[i], "--head-dim")) v = &c.dim;
		else if (!strcmp(argv[i], "--dtype")) v = &c.dtype;
		else if (!strcmp(argv[i], "--block-tokens")) v = &c.bt;
		if (!v || i + 1 >= argc) {
			fprintf(stderr, "kvbench-gpu: %s: unknown option or missing value\n", argv[i]);
			usage(stderr);
			return 2;
		}
		*v = strtoul(argv[++i], &end, 10);
		if (*end || (v != &c.gpu && (!*v || *v > 65536))) {
			fprintf(stderr, "kvbench-gpu: %s %s: must be a number 1..65536\n", argv[i - 1], argv[i]);
			return 2;
		}
	}
	rc = gpucopy_run(&c, &r, why, sizeof(why));
	if (rc > 0) {
		printf("kvbench-gpu: skipped, no GPU: %s\n", why);
		return 77;
	}
	if (rc < 0) {
		fprintf(stderr, "kvbench-gpu: %s\n", why);
		return 1;
	}
	printf("kvbench-gpu: GPU %lu (%s), layout %s, %lu blocks x %llu-byte pages (%lu layers x 2 x %llu-byte pieces), %lu iterations\n",
	       c.gpu, r.gpu_name, layout, c.blocks, (unsigned long long)r.page_bytes, c.layers,
	       (unsigned long long)r.half, c.iters);
	printf("  dtod     %8.1f GB/s  (cuMemcpyDtoD, one %llu-byte range)\n",
	       r.bytes / r.dtod_s / 1e9, (unsigned long long)r.bytes);
	printf("  gather   %8.1f GB/s  %5.1f%% of dtod  (target >= 80%%: %s)\n",
	       r.bytes / r.gather_s / 1e9, 100.0 * r.dtod_s / r.gather_s,
	       r.dtod_s / r.gather_s >= 0.8 ? "met" : "MISSED");
	printf("  scatter  %8.1f GB/s  %5.1f%% of dtod\n", r.bytes / r.scatter_s / 1e9,
	       100.0 * r.dtod_s / r.scatter_s);
	return 0;
}
