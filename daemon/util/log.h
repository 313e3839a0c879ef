/* SPDX-License-Identifier: MIT */
/*
 * log.h - kvcached's log lines on stderr. Under systemd (JOURNAL_STREAM
 * set) each line starts with a <N> syslog priority prefix that journald
 * turns into the entry's priority; on a terminal a level word instead.
 */
#ifndef KVD_LOG_H
#define KVD_LOG_H

enum kvd_log_level {
	KVD_LOG_ERR = 3,
	KVD_LOG_WARN = 4,
	KVD_LOG_INFO = 6,
	KVD_LOG_DEBUG = 7,
};

extern int kvd_log_level;

void kvd_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define kvd_err(...)   kvd_log(KVD_LOG_ERR, __VA_ARGS__)
#define kvd_warn(...)  kvd_log(KVD_LOG_WARN, __VA_ARGS__)
#define kvd_info(...)  kvd_log(KVD_LOG_INFO, __VA_ARGS__)
#define kvd_debug(...) kvd_log(KVD_LOG_DEBUG, __VA_ARGS__)

#endif
