// SPDX-License-Identifier: MIT
/*
 * spill_avx2.c - XXH3-64 of spill payloads built for AVX2, which the
 * spill tier picks at run time where the CPU has it (spill_slot.c). Same
 * hash, same value as the default (SSE2) build, at about 2.8x the speed
 * here (36 vs 13 GB/s): every spilled and restored page is hashed on the
 * daemon's main thread, so this is the difference between the spill tier
 * and raw O_DIRECT (docs/BENCHMARKS.md). Nothing else in this file may be
 * called on a CPU without AVX2.
 */
#include <stddef.h>
#include <stdint.h>

uint64_t kvd_payload_check_avx2(const void *p, size_t len);

#if defined(__x86_64__)
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2"))), apply_to = function)
#else
#pragma GCC target("avx2")
#endif
#include <immintrin.h>
#define XXH_VECTOR XXH_AVX2
#define XXH_INLINE_ALL
#include <xxhash.h>

uint64_t kvd_payload_check_avx2(const void *p, size_t len)
{
	return XXH3_64bits(p, len);
}
#if defined(__clang__)
#pragma clang attribute pop
#endif
#else
uint64_t kvd_payload_check_avx2(const void *p, size_t len)
{
	(void)p;
	(void)len;
	return 0;	/* never called off x86-64 */
}
#endif
