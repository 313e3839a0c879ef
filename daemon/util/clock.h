/* SPDX-License-Identifier: MIT */
/*
 * clock.h - the daemon's one monotonic clock (CLOCK_MONOTONIC), for every
 * floor: deadlines, ticks, timings. Wall-clock times (CLOCK_REALTIME)
 * are read where they are printed.
 */
#ifndef KVD_CLOCK_H
#define KVD_CLOCK_H

#include <stdint.h>
#include <time.h>

/* CLOCK_MONOTONIC in nanoseconds. */
static inline uint64_t kvd_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* CLOCK_MONOTONIC in milliseconds. */
static inline uint64_t kvd_now_ms(void)
{
	return kvd_now_ns() / 1000000u;
}

#endif
