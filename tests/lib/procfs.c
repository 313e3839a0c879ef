// SPDX-License-Identifier: MIT
/*
 * procfs.c - see procfs.h.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "procfs.h"

uint64_t kvt_proc_kb(const char *path, const char *key)
{
	char line[256];
	uint64_t v = 0;
	FILE *f = fopen(path, "r");

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, key, strlen(key))) {
			v = strtoull(line + strlen(key), NULL, 10);
			break;
		}
	fclose(f);
	return v;
}

void kvt_proc_cpu_jiffies(unsigned long long *steal, unsigned long long *total)
{
	unsigned long long v[8] = { 0 };
	FILE *f = fopen("/proc/stat", "r");
	int i;

	*steal = *total = 0;
	if (!f)
		return;
	if (fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3],
		   &v[4], &v[5], &v[6], &v[7]) == 8) {
		for (i = 0; i < 8; i++)
			*total += v[i];
		*steal = v[7];
	}
	fclose(f);
}

int64_t kvt_smaps_kb(int pid, const char *vma, uintptr_t start, const char *key)
{
	char path[64], line[4096];
	unsigned long s, e;
	int64_t sum = 0;
	bool in = false;
	FILE *f;

	if (pid)
		snprintf(path, sizeof(path), "/proc/%d/smaps", pid);
	else
		snprintf(path, sizeof(path), "/proc/self/smaps");
	f = fopen(path, "r");
	if (!f)
		return -1;
	/* A file the kernel lets us open but not read is empty: -1 too. */
	if (!fgets(line, sizeof(line), f)) {
		fclose(f);
		return -1;
	}
	do {
		if (sscanf(line, "%lx-%lx ", &s, &e) == 2) {
			in = vma ? strstr(line, vma) != NULL : s == start;
			continue;
		}
		if (in && !strncmp(line, key, strlen(key)))
			sum += strtoll(line + strlen(key), NULL, 10);
	} while (fgets(line, sizeof(line), f));
	fclose(f);
	return sum;
}
