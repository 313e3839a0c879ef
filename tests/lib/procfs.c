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
