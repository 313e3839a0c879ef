/* SPDX-License-Identifier: MIT */
/*
 * procfs.h - reading /proc for tests and kvbench: a "Key: N kB" line of
 * /proc/meminfo or /proc/PID/status.
 */
#ifndef KVT_PROCFS_H
#define KVT_PROCFS_H

#include <stdint.h>

/* The value after `key` (e.g. "MemAvailable:") on its line of `path`, in
 * the file's unit (kB for these files); 0 if the file or key is missing. */
uint64_t kvt_proc_kb(const char *path, const char *key);

#endif
