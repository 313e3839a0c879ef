// SPDX-License-Identifier: MIT
/*
 * page_copy.cu - the page kernels: gather (pool -> engine), scatter
 * (engine -> pool) and the page checksum. page_ref.h defines what they
 * compute and page_ref.c is their CPU reference; the GPU tests hold these
 * to it byte for byte.
 *
 * Copy: a run of n blocks is n x layers x halves segments (one block of one
 * layer's K or V, or MLA latent). An engine that holds every head copies
 * a segment as `half` contiguous bytes; a tensor-parallel rank copies its
 * heads of each token row, `rows` runs of `row` bytes spaced `page_row`
 * apart in the page (page_ref.h). One thread block takes one segment at a
 * time (grid-stride over segments), with the widest access that the
 * addresses and lengths allow (16, 8, 4 or 1 bytes; uniform within a
 * thread block, so no divergence); a whole run copies four loads in flight
 * per thread before the stores. A Llama-3-8B block is 64 segments of 32
 * KiB: 2048 16-byte vectors per segment, 8 per thread; at TP 2 each rank's
 * segment is 16 rows of 1 KiB, the same 16-byte vectors, 4 per thread.
 *
 * Checksum: one thread block per page, strided partial sums of
 * fmix64(word + (i + 1) x step) per thread, a warp-shuffle and shared
 * memory reduction, and fmix64(sum ^ bytes) by thread 0. Sums mod 2^64 are
 * associative, so this equals kvk_ref_checksum exactly.
 *
 * Built by the Makefile into a fatbin (no GPU needed), embedded in
 * libkvclient and kvcached, loaded with cuModuleLoadData.
 */
#include <stdint.h>

#include "page_ref.h"
#include "page_cuda.h"

/*
 * Addresses arrive as integers, so without help the compiler emits generic
 * loads and stores; __ldg makes them global, read-only-cached loads (the
 * source is not written while the kernel runs: pinned pool pages for a
 * gather, the engine's blocks for a scatter) and __stcg global stores that
 * bypass L1 (nothing here reads them back).
 */
template <typename T>
__device__ __forceinline__ void copy_run(uint8_t *__restrict__ dst,
					 const uint8_t *__restrict__ src, uint64_t bytes)
{
	T *d = reinterpret_cast<T *>(dst);
	const T *s = reinterpret_cast<const T *>(src);
	const uint64_t nv = bytes / sizeof(T), B = blockDim.x;
	uint64_t i = threadIdx.x;

	for (; i + 3 * B < nv; i += 4 * B) {
		T a = __ldg(s + i), b = __ldg(s + i + B), c = __ldg(s + i + 2 * B),
		  e = __ldg(s + i + 3 * B);

		__stcg(d + i, a);
		__stcg(d + i + B, b);
		__stcg(d + i + 2 * B, c);
		__stcg(d + i + 3 * B, e);
	}
	for (; i < nv; i += B)
		__stcg(d + i, __ldg(s + i));
}

/*
 * A tensor-parallel rank's heads: `rows` runs of `row` bytes, `dstride`
 * apart in dst and `sstride` apart in src (one of them `row`: the
 * engine's rows are consecutive). The vectors of all runs are spread over
 * the thread block as one index space, so short runs (a few heads of one
 * token) still keep every thread busy.
 */
template <typename T>
__device__ __forceinline__ void copy_rows(uint8_t *__restrict__ dst,
					  const uint8_t *__restrict__ src, uint64_t rows,
					  uint64_t row, uint64_t dstride, uint64_t sstride)
{
	const uint64_t per = row / sizeof(T), nv = rows * per;

	for (uint64_t i = threadIdx.x; i < nv; i += blockDim.x) {
		const uint64_t t = i / per, c = i - t * per;
		T v = __ldg(reinterpret_cast<const T *>(src + t * sstride) + c);

		__stcg(reinterpret_cast<T *>(dst + t * dstride) + c, v);
	}
}

extern "C" __global__ void __launch_bounds__(KVK_THREADS)
kvk_copy(struct kvk_copy_params p)
{
	const uint64_t *tensors = reinterpret_cast<const uint64_t *>(p.tensors);
	const uint64_t *offs = reinterpret_cast<const uint64_t *>(p.offs);
	const uint64_t per_block = (uint64_t)p.halves * p.layers;

	for (uint64_t g = blockIdx.x; g < p.segs; g += gridDim.x) {
		const uint64_t j = g / per_block, r = g % per_block;
		uint8_t *pool = reinterpret_cast<uint8_t *>(p.pool + offs[2 * j] + r * p.page_half +
							    p.page_off);
		uint8_t *eng = reinterpret_cast<uint8_t *>(tensors[r] + offs[2 * j + 1]);
		uint8_t *dst = p.dir == KVK_GATHER ? eng : pool;
		const uint8_t *src = p.dir == KVK_GATHER ? pool : eng;

		if (p.rows == 1) {	/* every head: the segment is one run */
			const uint64_t a = reinterpret_cast<uint64_t>(dst) |
					   reinterpret_cast<uint64_t>(src) | p.half;

			if (!(a & 15))
				copy_run<uint4>(dst, src, p.half);
			else if (!(a & 7))
				copy_run<uint2>(dst, src, p.half);
			else if (!(a & 3))
				copy_run<unsigned int>(dst, src, p.half);
			else
				copy_run<unsigned char>(dst, src, p.half);
		} else {		/* a rank's heads: one run per token */
			const uint64_t ds = p.dir == KVK_GATHER ? p.row : p.page_row;
			const uint64_t ss = p.dir == KVK_GATHER ? p.page_row : p.row;
			const uint64_t a = reinterpret_cast<uint64_t>(dst) |
					   reinterpret_cast<uint64_t>(src) | p.row | p.page_row;

			if (!(a & 15))
				copy_rows<uint4>(dst, src, p.rows, p.row, ds, ss);
			else if (!(a & 7))
				copy_rows<uint2>(dst, src, p.rows, p.row, ds, ss);
			else if (!(a & 3))
				copy_rows<unsigned int>(dst, src, p.rows, p.row, ds, ss);
			else
				copy_rows<unsigned char>(dst, src, p.rows, p.row, ds, ss);
		}
	}
}

__device__ __forceinline__ uint64_t fmix64(uint64_t k)
{
	k ^= k >> 33;
	k *= 0xff51afd7ed558ccdull;
	k ^= k >> 33;
	k *= 0xc4ceb9fe1a85ec53ull;
	k ^= k >> 33;
	return k;
}

extern "C" __global__ void __launch_bounds__(KVK_THREADS)
kvk_csum(struct kvk_csum_params p)
{
	__shared__ unsigned long long warp_sum[KVK_THREADS / 32];
	const uint64_t *addrs = reinterpret_cast<const uint64_t *>(p.addrs);
	uint64_t *out = reinterpret_cast<uint64_t *>(p.out);
	const uint64_t words = p.bytes / 8, tail = p.bytes % 8;

	for (uint64_t pg = blockIdx.x; pg < p.n; pg += gridDim.x) {
		const uint8_t *b = reinterpret_cast<const uint8_t *>(addrs[pg]);
		const bool aligned = !(addrs[pg] & 7);
		unsigned long long s = 0;

		for (uint64_t i = threadIdx.x; i < words + (tail ? 1 : 0); i += blockDim.x) {
			uint64_t w = 0;

			if (aligned && i < words) {
				w = reinterpret_cast<const uint64_t *>(b)[i];
			} else {
				/* Unaligned page or the padded last word. */
				uint64_t nb = i < words ? 8 : tail;

				for (uint64_t k = 0; k < nb; k++)
					w |= (uint64_t)b[i * 8 + k] << (8 * k);
			}
			s += fmix64(w + (i + 1) * KVK_CSUM_STEP);
		}
		for (int o = 16; o > 0; o >>= 1)
			s += __shfl_down_sync(0xffffffffu, s, o);
		if ((threadIdx.x & 31) == 0)
			warp_sum[threadIdx.x >> 5] = s;
		__syncthreads();
		if (threadIdx.x == 0) {
			unsigned long long t = 0;

			for (unsigned w = 0; w < blockDim.x / 32; w++)
				t += warp_sum[w];
			out[pg] = fmix64(t ^ p.bytes);
		}
		__syncthreads();	/* warp_sum is reused by the next page */
	}
}
