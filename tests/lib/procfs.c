// SPDX-License-Identifier: MIT
/*
 * procfs.c - see procfs.h.
 */
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
