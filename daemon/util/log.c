// SPDX-License-Identifier: MIT
/*
 * log.c - one line per event on stderr, journald-friendly (see log.h).
 * The line is formatted into one buffer and written with one write(2) so
 * that lines from a signal-time shutdown never interleave.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"

int kvd_log_level = KVD_LOG_INFO;

void kvd_log(int level, const char *fmt, ...)
{
	static const char *const word[8] = {
		[KVD_LOG_ERR] = "error", [KVD_LOG_WARN] = "warning",
		[KVD_LOG_INFO] = "info", [KVD_LOG_DEBUG] = "debug",
	};
	char line[1024];
	va_list ap;
	int n;

	if (level > kvd_log_level)
		return;
	if (getenv("JOURNAL_STREAM"))
		n = snprintf(line, sizeof(line), "<%d>", level);
	else
		n = snprintf(line, sizeof(line), "kvcached[%d]: %s: ", (int)getpid(),
			     word[level & 7] ? word[level & 7] : "log");
	va_start(ap, fmt);
	n += vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
	va_end(ap);
	if (n > (int)sizeof(line) - 2)
		n = (int)sizeof(line) - 2;
	line[n++] = '\n';
	if (write(STDERR_FILENO, line, (size_t)n) < 0)
		return;
}

bool kvd_log_allow(struct kvd_ratelimit *rl, uint64_t now_ms)
{
	if (rl->since_ms && now_ms - rl->since_ms < KVD_LOG_INTERVAL_MS) {
		rl->more++;
		return false;
	}
	kvd_log_more(rl, now_ms);	/* if the tick has not said it yet */
	rl->since_ms = now_ms ? now_ms : 1;
	rl->more = 0;
	return true;
}

void kvd_log_more(struct kvd_ratelimit *rl, uint64_t now_ms)
{
	if (!rl->since_ms || now_ms - rl->since_ms < KVD_LOG_INTERVAL_MS)
		return;
	if (rl->more)
		kvd_warn("%s: %llu more like it in the last %llu s", rl->what,
			(unsigned long long)rl->more,
			(unsigned long long)(now_ms - rl->since_ms + 500) / 1000);
	rl->since_ms = 0;
	rl->more = 0;
}
