// SPDX-License-Identifier: MIT
/*
 * kvsizes.c - the sizes and field offsets of kvclient.h's structs as the C
 * compiler lays them out, one "struct.field offset" line each and
 * "struct size N", for tests/python/test_api.py to hold the ctypes
 * declarations of kvclient/_lib.py to.
 */
#include <stddef.h>
#include <stdio.h>

#include "../../libclient/kvclient.h"

#define F(s, f) printf(#s "." #f " %zu\n", offsetof(struct s, f))
#define S(s) printf(#s " size %zu\n", sizeof(struct s))

int main(void)
{
	S(kvc_layout);
	F(kvc_layout, size), F(kvc_layout, kind), F(kvc_layout, flags), F(kvc_layout, layers);
	F(kvc_layout, num_blocks), F(kvc_layout, block_stride), F(kvc_layout, k);
	F(kvc_layout, v), F(kvc_layout, device), F(kvc_layout, resv32), F(kvc_layout, resv);
	S(kvc_copy_opts);
	F(kvc_copy_opts, size), F(kvc_copy_opts, flags), F(kvc_copy_opts, first_layer);
	F(kvc_copy_opts, layers), F(kvc_copy_opts, stream), F(kvc_copy_opts, event);
	F(kvc_copy_opts, layer_events), F(kvc_copy_opts, resv);
	S(kvc_gpu_status);
	F(kvc_gpu_status, size), F(kvc_gpu_status, state), F(kvc_gpu_status, device);
	F(kvc_gpu_status, chunks), F(kvc_gpu_status, chunks_registered);
	F(kvc_gpu_status, resv32), F(kvc_gpu_status, bytes_registered);
	F(kvc_gpu_status, register_ns), F(kvc_gpu_status, why), F(kvc_gpu_status, resv);
	printf("KVC_GPU_CHUNK %llu\n", (unsigned long long)KVC_GPU_CHUNK);
	return 0;
}
