/* SPDX-License-Identifier: MIT */
/*
 * obswait.h - the daemon's counters through an observer mapping a test
 * keeps (libclient/observe.h), and polling until a condition holds: the
 * daemon folds ledgers and runs its timers on its tick, so a test waits
 * for what it expects, with a bound that fails it instead of hanging.
 */
#ifndef KVT_OBSWAIT_H
#define KVT_OBSWAIT_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "../../libclient/observe.h"
#include "../../shm/segment.h"

/* Counter at byte offset off of struct kvshm_stats, now. */
static inline uint64_t kvt_obs_stat(const struct kvobs *o, size_t off)
{
	return atomic_load((_Atomic uint64_t *)((char *)kvshm_stats(o->h) + off));
}
#define KVT_STAT(o, f) kvt_obs_stat((o), offsetof(struct kvshm_stats, f))

static inline void kvt_sleep_5ms(void)
{
	struct timespec ts = { 0, 5000000L };

	nanosleep(&ts, NULL);
}

/* Poll every 5 ms until cond, failing the (cmocka) test after ms. */
#define KVT_UNTIL(cond, ms)                                                    \
	do {                                                                   \
		int tries_ = 0;                                                \
		while (!(cond)) {                                              \
			if (++tries_ > (ms) / 5)                               \
				fail_msg("timed out waiting for %s", #cond);   \
			kvt_sleep_5ms();                                       \
		}                                                              \
	} while (0)

#endif
