/* SPDX-License-Identifier: MIT */
/*
 * log.h - kvcached's log lines on stderr. Under systemd (JOURNAL_STREAM
 * set) each line starts with a <N> syslog priority prefix that journald
 * turns into the entry's priority; on a terminal a level word instead.
 */
#ifndef KVD_LOG_H
#define KVD_LOG_H

#include <stdbool.h>
#include <stdint.h>

enum kvd_log_level {
	KVD_LOG_ERR = 3,
	KVD_LOG_WARN = 4,
	KVD_LOG_INFO = 6,
	KVD_LOG_DEBUG = 7,
};

extern int kvd_log_level;

void kvd_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/*
 * Repeated warnings (one per block of a bad fetch, say): the first of an
 * interval is logged, the rest only counted; once the interval has passed,
 * kvd_log_more writes one "N more like it" line (call it from the tick),
 * and the next warning is logged again. Times in ms, any monotonic clock.
 */
#define KVD_LOG_INTERVAL_MS 5000
struct kvd_ratelimit {
	const char *what;	/* names them in the count line */
	uint64_t since_ms;	/* the interval's first warning; 0: none */
	uint64_t more;		/* counted, not logged, since */
};
/* True: log this one (the first of its interval); false: counted. */
bool kvd_log_allow(struct kvd_ratelimit *rl, uint64_t now_ms);
/* When the interval has passed: a warning "<what>: N more like it in the
 * last S s" if any were counted, and a new interval begins. */
void kvd_log_more(struct kvd_ratelimit *rl, uint64_t now_ms);

#define kvd_err(...)   kvd_log(KVD_LOG_ERR, __VA_ARGS__)
#define kvd_warn(...)  kvd_log(KVD_LOG_WARN, __VA_ARGS__)
#define kvd_info(...)  kvd_log(KVD_LOG_INFO, __VA_ARGS__)
#define kvd_debug(...) kvd_log(KVD_LOG_DEBUG, __VA_ARGS__)

#endif
