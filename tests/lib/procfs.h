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

/*
 * The sum of `key` ("ShmemPmdMapped:", in kB) over the VMAs of process
 * pid (0: this one) whose line names `vma` (a substring such as
 * "memfd:kvcached-pool"), or, with vma NULL, the one that starts at
 * `start`. 0 when none matches; -1 when the smaps file cannot be read (a
 * daemon that is not dumpable keeps it from all but root).
 */
int64_t kvt_smaps_kb(int pid, const char *vma, uintptr_t start, const char *key);

#endif
